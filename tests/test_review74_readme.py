"""Review 74: README.md's CPU-checkable claims, sentence by sentence, checked by running code.

Earlier reviews (tests/test_review4_readme.py, test_review28_readme.py, test_review11_docs.py,
test_review8_docs.py) pin the quick start's plan, the eval example, the env-var names, the
NumPy-scalar rules, pad, fusion parameter rules, string annotations, .maxntid, the disk tier's
unwritable/future-dated cases, KERNELPACK_CACHE_MAX_BYTES, extract names, power-of-two sizes,
kp.f32(...)'s TypeError and the defaults opt=3 / timeout_s=1. This file checks what they do not.

Status (review 74, session of 2026-12-03; the helper had ~40 minutes):
- Reached: README lines 1-430 (install, quick start, kp.external, NVRTC, expressions, DSL and
  its typing rules, the Annotated spelling), 466-467 (1 MiB mmap, two fds), 551-650 partly (kp.Cache
  defaults/dirs/redaction/origin, on/off values, signing), 698-717 (CLI exit statuses,
  keygen, sign, verify, diff, eval, inspect --device/--driver).
  Not reached / not checked: lines 432-530 apart from 466-467 (GPU running: mostly GPU-only;
  stream= float/bool TypeError and "no GPU raises DeviceError" unchecked), 532-549 build's
  failure handling, default targets and --cache progress text, L135 a killed save's temporary,
  L170 headers= in the cache key, 569-586 cache key parts and `cache explain`,
  587-624 lock/Redis/quarantine/world-writable guards, 652-696 (benchmarks: skipped),
  732-758 (layout: pinned by review 11).
- Claims checked by running code: 93 hold, 0 do not hold, 2 imprecise (39 tests, 1 xfail;
  both imprecise claims corrected in session 57, the xfail now passes).
- Skipped (GPU-only, performance or benchmark figures): 41 sentences/figures
  (lines 65-104 timings and fast paths, 280-282 half rounding, 284-334 reduction schedules
  and cast results on device, 416-423 ptxas bug, 425-427 memory figures, 433-530 launches,
  652-696 benchmarks).

Imprecise:
1. Line 370: "`kp.max(0.0, -0.0)` is `+0.0` where NumPy's `np.maximum` returns its second
   operand (`-0.0`)". Written as it stands (two Python floats) kp.max computes on the host as
   float64 and returns -0.0, as NumPy does (line 352 says plain numbers are computed on the
   host); the +0.0 holds only for float32/half tensors on the device. README should say "of
   float32 tensors". test_kp_max_of_python_signed_zeros_matches_readme (xfail, strict).
2. Line 710: "`--driver` adds the CUDA driver version's rules"; with `--device sm_86 --driver
   12.4`, `inspect` says the PTX image is "compiled locally for the device with nvJitLink",
   while line 471 says that where nvJitLink is newer than the driver (nvJitLink 13.5 here)
   the driver JITs the PTX. inspect cannot know the loading machine's nvJitLink, so its
   wording overstates; report only (no test: the runtime side needs a GPU). Session 57:
   inspect's reason now reads "PTX, compiled for the device at load (nvJitLink/JIT)" (README,
   `--device`, says which compiles it where).
"""

from __future__ import annotations

import functools
import math
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PTX = (ROOT / "examples" / "axpy.ptx").read_text()
T = kp.Tensor
CLI = [sys.executable, "-m", "kernelpack"]


def _params(a_dtype=kp.f32, n32_value="n", x_name="x"):
    return [kp.Tensor(x_name, kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", a_dtype), kp.Scalar("n32", kp.u32, value=n32_value)]


def _axpy(**kw):
    d = dict(params=_params(), grid=kp.cdiv("n", 256), block=256, ptx=PTX, targets=["sm_80"])
    d.update(kw)
    return kp.external("axpy", "axpy", **d)


def _dtypes(f, static=None):
    g = kp.fusion(f)
    gr = g.trace(static) if static else g.trace()
    return [str(gr.nodes[i].dtype) for _, i in gr.outputs]


# ---------------------------------------------------------------- kp.external (lines 140-163)

def test_external_argument_list_checked_against_the_ptx_entry():
    """L142-145: 'a different count is a `ValueError` ..., a different width (an `f64` scalar
    for a `.param .f32`) a `UserWarning`.'"""
    with pytest.raises(ValueError, match="declares 4 parameter"):
        _axpy(args=["x", "y", "a"])
    with pytest.warns(UserWarning, match=r"\.param \.f32 a"):
        _axpy(params=_params(a_dtype=kp.f64))


def test_external_constant_fields_checked_where_declared():
    """L151-158: block against CUDA's limits, constant computed scalars against their dtype, an
    always-false constant constraint and an unevaluable symbol-free expression (`kp.shl(1, 64)`,
    `kp.cdiv(1, 0)`) are ValueErrors naming the field; names are at most 1024 UTF-8 bytes."""
    with pytest.raises(ValueError, match=r"block \(2048, 1, 1\)"):
        _axpy(block=2048)
    with pytest.raises(ValueError, match=r"grid\.x = 1 << 64"):
        _axpy(grid=kp.shl(1, 64))
    with pytest.raises(ValueError, match=r"grid\.x = cdiv\(1, 0\)"):
        _axpy(grid=kp.cdiv(1, 0))
    with pytest.raises(ValueError, match="always false"):
        _axpy(constraints=[(kp.sym("n") * 0 > 1, "never")])
    with pytest.raises(ValueError, match="does not fit uint32"):
        _axpy(params=_params(n32_value=-1))
    _axpy(params=_params(x_name="x" * 1024))
    with pytest.raises(ValueError, match="1024 UTF-8 bytes"):
        _axpy(params=_params(x_name="x" * 1025))
    # a multi-byte name: 512 two-byte characters fit, 513 do not
    _axpy(params=_params(x_name="é" * 512))
    with pytest.raises(ValueError, match="1024 UTF-8 bytes"):
        _axpy(params=_params(x_name="é" * 513))


def test_external_cubins_are_checked():
    """L145-148: `cubin=bytes` (one sm_XY target) or a dict whose keys are the targets (a
    `targets=` beside it must name the same architectures); kernelpack checks CUDA ELF, the
    declared architecture and the entry."""
    cub80 = _axpy(targets=["sm_80"]).modules[0].images[0].data
    cub90 = _axpy(targets=["sm_90"]).modules[0].images[0].data
    kw = dict(params=_params(), grid=kp.cdiv("n", 256), block=256)
    kp.external("axpy", "axpy", cubin=cub80, targets=["sm_80"], **kw)
    with pytest.raises(ValueError, match="exactly one sm_XY target"):
        kp.external("axpy", "axpy", cubin=cub80, **kw)
    kp.external("axpy", "axpy", cubin={"sm_90": cub90}, targets=["sm_90"], **kw)
    with pytest.raises(ValueError, match="dict's keys are the targets"):
        kp.external("axpy", "axpy", cubin={"sm_90": cub90}, targets=["sm_80"], **kw)
    with pytest.raises(kp.CompileError, match="built for sm_80"):
        kp.external("axpy", "axpy", cubin={"sm_90": cub80}, **kw)
    with pytest.raises(kp.CompileError, match="ELF"):
        kp.external("axpy", "axpy", cubin={"sm_90": b"\x00" * 64}, **kw)
    with pytest.raises(kp.CompileError, match="'nope' is not in the cubin"):
        kp.external("axpy", "nope", cubin=cub80, targets=["sm_80"], **kw)


def test_programs_share_a_named_module_and_conflicts_are_refused(tmp_path):
    """L161-163: programs naming one `module=` share it when their images are the same;
    `kp.save` refuses two different modules of one name with a ValueError."""
    a = _axpy(module="m")
    b = kp.external("axpy2", "axpy", params=_params(), grid=kp.cdiv("n", 256), block=256,
                    ptx=PTX, targets=["sm_80"], module="m")
    kp.save([a, b], tmp_path / "s.kpack")
    out = subprocess.run(CLI + ["inspect", "--json", str(tmp_path / "s.kpack")],
                         capture_output=True, text=True, check=True).stdout
    import json
    assert len(json.loads(out)["modules"]) == 1
    c = kp.external("axpy2", "axpy", params=_params(), grid=kp.cdiv("n", 256), block=256,
                    ptx=PTX, targets=["sm_90"], module="m")
    with pytest.raises(ValueError, match="two different modules are named 'm'"):
        kp.save([a, c], tmp_path / "s2.kpack")


# ---------------------------------------------------------------- NVRTC (lines 165-198)

SCALE_SRC = r"""
    template <typename T> __global__ void scale(T* x, T a, unsigned n) {
        unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] *= a;
    }"""


def _scale(**kw):
    d = dict(params=[kp.Tensor("x", kp.f32, ["n"], role="inout"), kp.Scalar("a", kp.f32),
                     kp.Scalar("n32", kp.u32, value="n")],
             grid=kp.cdiv("n", 256), block=256, cuda=SCALE_SRC,
             nvrtc_options=["--use_fast_math"], targets=["sm_80", "sm_90", "ptx"])
    d.update(kw)
    return kp.external("scale_f32", "scale<float>", **d)


def test_nvrtc_snippet_mangled_name_toolchain_and_determinism():
    """L171-190: images record `NVRTC 13.5`-style toolchains, the same call gives the same
    bytes, the snippet's kernels are ('_Z5scaleIfEvPT_S0_j',), PTX for the lowest arch."""
    s1, s2 = _scale(), _scale()
    assert s1.modules[0].kernels == ("_Z5scaleIfEvPT_S0_j",)
    imgs = s1.modules[0].images
    assert [i.target for i in imgs] == ["sm_80", "sm_90", "compute_80"]
    assert all(i.toolchain.startswith("NVRTC 1") for i in imgs)
    assert [i.data for i in imgs] == [i.data for i in s2.modules[0].images]


@pytest.mark.parametrize("opt", ["-arch=sm_70", "--gpu-architecture=sm_80", "-rdc=true",
                                 "-dlto"])
def test_nvrtc_arch_and_output_flags_refused(opt):
    """L168-170: `-arch`, `-rdc`, `-dlto`, ... are refused because the targets decide them."""
    with pytest.raises(ValueError, match="nvrtc_options"):
        _scale(nvrtc_options=[opt], targets=["sm_80"])


def test_nvrtc_includes_only_through_I_or_headers(tmp_path, monkeypatch):
    """L170, L193-195: `#include "..."` finds headers only through `-I` (not the current
    directory); `headers={...}` hands them as text; a compile error is kp.CompileError with
    NVRTC's log and the target."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "defs.h").write_text("#define SCALE 2\n")
    src = '#include "defs.h"\n' + SCALE_SRC.replace("x[i] *= a", "x[i] *= a * SCALE")
    with pytest.raises(kp.CompileError, match=r"(?s)sm_80.*defs\.h"):
        _scale(cuda=src, targets=["sm_80"])
    _scale(cuda=src, targets=["sm_80"], nvrtc_options=["-I."])
    _scale(cuda=src, targets=["sm_80"], headers={"defs.h": "#define SCALE 2\n"})
    with pytest.raises(kp.CompileError, match=r"(?s)for sm_80.*--- log ---.*expected"):
        _scale(cuda="__global__ void scale(float* x { }", targets=["sm_80"])


# ---------------------------------------------------------------- expressions (212-216)

def test_expression_operators_and_structural_equality():
    """L212-216: operators and helpers build expressions; `==` is structural (a constant
    equals its int: `kp.sym("n") * 0 == 0`); `kp.eq` is the symbolic comparison."""
    n = kp.sym("n")
    assert (n * 0 == 0) is True
    assert (n == 0) is False
    assert str(kp.eq(n, 0)) == "n == 0"
    for e in (n + 1, n - 1, n * 2, n // 2, n % 3, n << 1, n >> 1, n < 1, n <= 1, n > 1,
              n >= 1, kp.emin(n, 3), kp.emax(n, 3), kp.shl(1, n),
              kp.select(n > 1, n, 1)):
        assert isinstance(e, type(n))


# ---------------------------------------------------------------- DSL (243-385)

@pytest.fixture(scope="module")
def softmax_summary(tmp_path_factory):
    @kp.fusion
    def scaled_softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
        z = x * s
        e = kp.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    c = kp.compile(scaled_softmax, targets=["sm_90"])
    path = tmp_path_factory.mktemp("r74") / "model.kpack"
    kp.save([c], path)
    return kp.load(path)["scaled_softmax"].summary


def test_scaled_softmax_has_the_nine_variants_described(softmax_summary):
    """L243-247: nine variants: a split (`n >= 65536 and b <= 256`, five launches), a warp per
    row for n <= 128 and n <= 256, a block per row for n <= 512 .. n <= 8192 (blocks of 64 to
    256 threads), and a block loop for every longer row."""
    vs = softmax_summary.variants
    assert len(vs) == 9
    assert str(vs[0].predicate) == "n >= 65536 and b <= 256" and len(vs[0].launches) == 5
    limits = [128, 256, 512, 1024, 2048, 4096, 8192]
    for v, lim in zip(vs[1:8], limits):
        assert str(v.predicate).endswith(f"n <= {lim}")
        assert len(v.launches) == 1
    for v in vs[3:8]:
        assert 64 <= int(str(v.launches[0].block[0])) <= 256
    assert vs[8].predicate is None


def test_dsl_width_and_sign_mixes_are_trace_errors():
    """L338-340: `f32 + f64`, `i32 + i64`, `i64 + u64`, `i32 + u8` are TraceErrors."""
    for a, b in [(kp.f32, kp.f64), (kp.i32, kp.i64), (kp.i64, kp.u64), (kp.i32, kp.u8)]:
        def f(x: T[a, "n"], y: T[b, "n"]):
            return x + y
        with pytest.raises(kp.TraceError, match="dtype mismatch"):
            _dtypes(f)


def test_dsl_weak_numbers_and_sizes():
    """L341-347: `i32 + f32` is float32 and so is their comparison's operand; Python numbers and
    sizes are weak (`x_f16 * 2.0` float16, `i32 + x.shape[0]` int32; floats from sizes stay
    float32)."""
    def f(x: T[kp.i32, "n"], y: T[kp.f32, "n"]):
        return x + y

    def g(x: T[kp.f16, "n"], y: T[kp.i32, "n"]):
        return x * 2.0, y + x.shape[0]

    def h(x: T[kp.f32, "b", "n"]):
        return (x / x.shape[-1] ** 0.5, x * (1.0 / x.shape[1]), x / np.sqrt(x.shape[-1]),
                kp.sqrt(x.shape[0]) + x)
    assert _dtypes(f) == ["float32"]
    assert _dtypes(g) == ["float16", "int32"]
    assert _dtypes(h) == ["float32"] * 4


def test_dsl_sizes_have_no_python_value():
    """L350-351: `float(n)` or `math.sqrt(n)` inside a fusion is a TraceError."""
    def f(x: T[kp.f32, "n"]):
        return x * float(x.shape[0])

    def g(x: T[kp.f32, "n"]):
        return x * math.sqrt(x.shape[0])
    for fn in (f, g):
        with pytest.raises(kp.TraceError, match="no Python value"):
            _dtypes(fn)


def test_math_of_plain_numbers_is_computed_on_the_host():
    """L352-354: `kp.sqrt(2.0 / math.pi)`, `kp.pow(2.0, 0.5)`, `kp.where(flag, 1.0, 0.5)`,
    `kp.complex(1.0, 0.0)` give Python numbers; `kp.pow` of two ints is the exact int64 power."""
    assert kp.sqrt(2.0 / math.pi) == math.sqrt(2.0 / math.pi)
    assert kp.pow(2.0, 0.5) == 2.0 ** 0.5
    assert kp.where(True, 1.0, 0.5) == 1.0 and kp.where(False, 1.0, 0.5) == 0.5
    assert kp.complex(1.0, 0.0) == complex(1.0, 0.0)
    r = kp.pow(3, 39)
    assert r == 3 ** 39 and isinstance(r, int)


def test_two_operand_max_min_reductions_and_out_refused():
    """L365-367: two-operand `kp.max`/`kp.min` are elementwise; `kp.sum`/`kp.mean`/methods take
    `axis`, `dtype`, `keepdims`; `out=` is refused."""
    def f(x: T[kp.f32, "b", "n"], y: T[kp.f32, "b", "n"]):
        return (kp.max(x, y), kp.min(x, y), kp.sum(x, axis=1, dtype=kp.f64),
                kp.mean(x, axis=(0, 1), keepdims=True), x.prod(axis=0))
    assert _dtypes(f) == ["float32", "float32", "float64", "float32", "float32"]

    def g(x: T[kp.f32, "n"]):
        return kp.sum(x, out=x)
    with pytest.raises(kp.TraceError, match="out="):
        _dtypes(g)


def test_kp_max_of_python_signed_zeros_matches_readme():
    """L370 said '`kp.max(0.0, -0.0)` is `+0.0` where NumPy's `np.maximum` returns its second
    operand (`-0.0`)'; as written (two Python floats) kp.max computes on the host and returns
    -0.0, as NumPy does: +0.0 holds for float32 tensors. The README now says both (session
    57), and what it says of plain numbers holds."""
    flat = " ".join(README.split())
    assert "so `kp.max(0.0, -0.0)` is `+0.0`" not in flat
    assert "(`kp.max(0.0, -0.0)` is `-0.0`)" in flat
    assert math.copysign(1.0, kp.max(0.0, -0.0)) == -1.0
    assert math.copysign(1.0, kp.min(-0.0, 0.0)) == 1.0  # the second of two equal operands


def test_shape_comparison_is_structural_inside_a_fusion():
    """L375-378: with a `static=` dim of 4, `if x.shape[1] == 4:` takes its branch; a symbolic
    dim equals no int."""
    @kp.fusion
    def f(x: T[kp.f32, "b", "n"]):
        return x * 2 if x.shape[1] == 4 else x * 3
    consts = lambda g: [n.attrs[0] for n in g.nodes if n.op == "const"]  # noqa: E731
    assert set(consts(f.trace({"n": 4}))) == {2}
    assert set(consts(f.trace())) == {3}


def test_complex_rules():
    """L379-382: complex numbers are not ordered; of math functions only exp (and abs, .real,
    .imag, conj, arithmetic) take them; `**` takes integer exponents -8..8; TraceErrors."""
    def ok(x: T[kp.c64, "n"]):
        return kp.exp(x), abs(x), x.real, x.imag, kp.conj(x), x.conj(), x ** 8, x ** -8
    assert _dtypes(ok) == ["complex64", "float32", "float32", "float32"] + ["complex64"] * 4

    def lt(x: T[kp.c64, "n"], y: T[kp.c64, "n"]):
        return x < y

    def mx(x: T[kp.c64, "n"], y: T[kp.c64, "n"]):
        return kp.max(x, y)

    def sq(x: T[kp.c64, "n"]):
        return kp.sqrt(x)

    def lg(x: T[kp.c64, "n"]):
        return kp.log(x)

    def p9(x: T[kp.c64, "n"]):
        return x ** 9
    for fn, op in [(lt, "lt"), (mx, "max"), (sq, "sqrt"), (lg, "log"), (p9, "pow")]:
        with pytest.raises(kp.TraceError, match=op):
            _dtypes(fn)


def test_integer_negative_exponents():
    """L383-385: an integer base to a negative integer tensor exponent traces (truncated
    result); a negative literal exponent is a TraceError."""
    def f(x: T[kp.i32, "n"], e: T[kp.i32, "n"]):
        return x ** e

    def g(x: T[kp.i32, "n"]):
        return x ** -1
    assert _dtypes(f) == ["int32"]
    with pytest.raises(kp.TraceError, match="negative"):
        _dtypes(g)


def test_constant_sizes_that_cannot_exist_are_trace_errors():
    """L158-160: `kp.arange(1 << n)` with `static={"n": 64}` and `kp.pad(x, -1)` are
    TraceErrors; L251-252: `4 ** n` is `1 << 2n`."""
    def f(x: T[kp.f32, "n"]):
        return kp.arange(1 << x.shape[0])

    def g(x: T[kp.f32, "n"]):
        return kp.pad(x, -1)
    with pytest.raises(kp.TraceError, match="1 << 64"):
        _dtypes(f, {"n": 64})
    with pytest.raises(kp.TraceError, match="negative"):
        _dtypes(g)

    @kp.fusion
    def h(x: T[kp.f32, "n"]):
        return kp.arange(4 ** x.shape[0])
    gr = h.trace()
    assert str(gr.nodes[gr.outputs[0][1]].shape[0]) == str(kp.shl(1, kp.sym("n") * 2))


def test_traced_tensor_is_unhashable_trace_error_and_type_error():
    """L270-273: hashing a traced tensor (dict key, `functools.cache` under `@kp.fusion`) is a
    TraceError that says so, still a TypeError."""
    @functools.cache
    def inner(x):
        return x * 2

    def f(x: T[kp.f32, "n"]):
        return {x: 1}

    def g(x: T[kp.f32, "n"]):
        return inner(x)
    for fn in (f, g):
        with pytest.raises(kp.TraceError, match="hashed") as ei:
            _dtypes(fn)
        assert isinstance(ei.value, TypeError)


def test_fusion_that_calls_itself_is_a_trace_error():
    """L276-277: a fusion that calls itself is a TraceError."""
    @kp.fusion
    def c(x: T[kp.f32, "n"]):
        return c(x)
    with pytest.raises(kp.TraceError, match="calls itself"):
        c.trace()


def test_repeated_compile_returns_the_same_compiled():
    """L427-429: a process repeating a compile it made among its last 32 gets the same
    kp.Compiled back without compiling."""
    @kp.fusion
    def r74_twice(x: T[kp.f32, "n"]):
        return x * 2
    a = kp.compile(r74_twice, targets=["sm_90"])
    assert kp.compile(r74_twice, targets=["sm_90"]) is a


# ---------------------------------------------------------------- kp.Cache (551-639)

def test_cache_dir_whitespace_redaction_modes_and_origin(tmp_path, monkeypatch):
    """L564-565: a KERNELPACK_CACHE_DIR with leading/trailing whitespace is a ValueError naming
    it; L599: a Redis password shows as *** in reprs; L615-616: cache directories are made
    0700 whatever the umask; L556: origin "compiled", then "disk" in a later process; L578:
    meta/digests.json; L587/594: lock_ttl_s 120 s, ttl_s 7 days."""
    import inspect as _inspect
    params = _inspect.signature(kp.Cache).parameters
    assert params["lock_ttl_s"].default == 120 and params["ttl_s"].default == 7 * 86400
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", f" {tmp_path}/c")
    with pytest.raises(ValueError, match="KERNELPACK_CACHE_DIR"):
        kp.Cache()
    root = tmp_path / "c"
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no trusted_keys and no sign_with": not the point
        shown = repr(kp.Cache(remote="redis://:hunter2@cache-host:6379/0"))
    assert "hunter2" not in shown and "***" in shown
    code = ("import kernelpack as kp\n"
            "@kp.fusion\ndef r74c(x: kp.Tensor[kp.f32, 'n']):\n    return x * 2\n"
            "print(kp.compile(r74c, targets=['sm_90'], cache=kp.Cache()).origin)\n")
    env = {**os.environ, "KERNELPACK_CACHE_DIR": str(root)}
    old = os.umask(0)
    try:
        first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                               text=True, check=True).stdout.split()
    finally:
        os.umask(old)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=True).stdout.split()
    assert (first, second) == (["compiled"], ["disk"])
    for d in [root] + [p for p in root.rglob("*") if p.is_dir()]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert (root / "meta" / "digests.json").is_file()


@pytest.mark.parametrize("value,expected", [(v, True) for v in ("1", "true", "yes", "on")]
                         + [(v, False) for v in ("0", "false", "no", "off")])
def test_on_off_values(monkeypatch, value, expected):
    """L639: on/off variables take 1/true/yes/on and 0/false/no/off; L627: anything else is a
    ValueError naming the variable."""
    from kernelpack import config
    fn = next(getattr(config, n) for n in dir(config)
              if "native" in n.lower() and callable(getattr(config, n)))
    monkeypatch.setenv("KERNELPACK_NATIVE_LAUNCH", value)
    assert fn() is expected
    monkeypatch.setenv("KERNELPACK_NATIVE_LAUNCH", "maybe")
    with pytest.raises(ValueError, match="KERNELPACK_NATIVE_LAUNCH"):
        fn()


# ---------------------------------------------------------------- the CLI (698-717)

@pytest.fixture(scope="module")
def example(tmp_path_factory):
    d = tmp_path_factory.mktemp("r74ex")
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_example.py"),
                    str(d / "example.kpack")], check=True, capture_output=True, cwd=d)
    return d / "example.kpack"


def _cli(*args, cwd=None, **kw):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True,
                          cwd=cwd, **kw)


def test_cli_exit_statuses(example, tmp_path):
    """L700-705: 1 and one line `error: ...` for a bad file or a failed check, and for stdout
    that cannot be written (`> /dev/full`); 2 for a usage error; `| head -1` is no error;
    diff answers 0/1/2; eval's constraint violations exit 1 with the message."""
    r = _cli("inspect", tmp_path / "nofile.kpack")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert _cli("inspect", "--bogus", example).returncode == 2
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run(CLI + ["inspect", str(example)], stdout=full,
                               stderr=subprocess.PIPE, text=True)
        assert r.returncode == 1 and r.stderr.startswith("error: ")
    p = subprocess.Popen(CLI + ["inspect", str(example)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    assert p.wait() == 0 and p.stderr.read() == b""
    other = tmp_path / "other.kpack"
    kp.save([_axpy(block=128)], other)
    assert _cli("diff", example, example).returncode == 0
    assert _cli("diff", example, other).returncode == 1
    assert _cli("diff", example, tmp_path / "nofile").returncode == 2
    r = _cli("eval", example, "axpy", "x=10", "y=11", "a=0.5")
    assert r.returncode == 1 and "y.shape[0] is 11 but n = 10" in r.stderr


def test_keygen_sign_verify(example, tmp_path):
    """L715: keygen writes `kernelpack-signing.key` (mode 0600) and `.pub` in the current
    directory, never over an existing key; L716: sign re-saves signed, in place without -o;
    L711/L644: verify --trusted-key refuses an unsigned artifact; kp.load(trusted_keys=...)
    refuses unsigned files with SignatureError."""
    assert _cli("keygen", cwd=tmp_path).returncode == 0
    key = tmp_path / "kernelpack-signing.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and (tmp_path / (key.name + ".pub")).exists()
    before = key.read_bytes()
    assert _cli("keygen", cwd=tmp_path).returncode == 1 and key.read_bytes() == before
    f = tmp_path / "a.kpack"
    f.write_bytes(example.read_bytes())
    pub = str(key) + ".pub"
    assert _cli("verify", f, "--trusted-key", pub).returncode == 1
    with pytest.raises(kp.SignatureError):
        kp.load(f, trusted_keys=[pub])
    assert _cli("sign", f, "--key", key).returncode == 0
    assert f.read_bytes() != example.read_bytes()
    assert _cli("verify", f, "--trusted-key", pub).returncode == 0
    assert kp.load(f, trusted_keys=[pub]).programs == ["axpy"]


def test_trusted_key_all_zero_and_multi_key_file(tmp_path, example):
    """L646-649: a file of several keys is a ValueError; the all-zero key is a ValueError
    naming `trusted_keys`."""
    with pytest.raises(ValueError, match="trusted_keys"):
        kp.load(example, trusted_keys=[bytes(32)])
    _cli("keygen", "-o", tmp_path / "k1")
    _cli("keygen", "-o", tmp_path / "k2")
    both = tmp_path / "both.pub"
    both.write_text((tmp_path / "k1.pub").read_text() + (tmp_path / "k2.pub").read_text())
    with pytest.raises(ValueError):
        kp.load(example, trusted_keys=[str(both)])


# ---------------------------------------------------------------- loading (466-467)

@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_pack_over_1_mib_holds_two_descriptors(tmp_path):
    """L466-467: a pack read from a file over 1 MiB is memory-mapped and holds two file
    descriptors while it lives (a small one holds none)."""
    import gc
    big = PTX + "".join("// %s\n" % os.urandom(60).hex() for _ in range(20000))
    kp.save([_axpy(ptx=big, targets=["sm_80", "ptx"])], tmp_path / "big.kpack")
    assert (tmp_path / "big.kpack").stat().st_size > 1 << 20
    kp.save([_axpy()], tmp_path / "small.kpack")
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    gc.collect()
    n0 = fds()
    small = kp.load(tmp_path / "small.kpack")
    assert fds() == n0
    pack = kp.load(tmp_path / "big.kpack")
    assert fds() == n0 + 2
    del pack, small
    gc.collect()
    assert fds() == n0


def test_annotated_spelling_gives_the_same_fusion():
    """L387-409: a fusion annotated through `typing.Annotated` is the same fusion (same
    canonical form, so the same key and code) as the unwrapped one."""
    from typing import Annotated, Any
    Rows = Annotated[Any, kp.Tensor[kp.f32, "b", "n"]]

    def body(x, s):
        z = x * s
        e = kp.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def scaled_softmax_typed(x: Rows, s: Annotated[float, kp.f32]) -> Any:
        return body(x, s)

    def plain(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
        return body(x, s)
    a = kp.fusion(name="sm")(scaled_softmax_typed).canonical_bytes()
    assert a == kp.fusion(name="sm")(plain).canonical_bytes()
