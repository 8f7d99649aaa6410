"""Review 27: the public call API on a GPU, tested from the outside (README "Running on a GPU").

Fusions written here (not the library's own workloads) are compiled with
``kp.compile(targets=["sm_90"])``, saved to a file and loaded back, then called the ways the
README promises: torch in → torch out (one output, or a tuple of several), ``out=`` as one
array / tuple / list / dict, keyword arguments, scalars of several Python/NumPy kinds,
``stream=``, CUDA graph capture with ``out=`` replayed on new data, CuPy, an object exposing
only ``__cuda_array_interface__`` (→ a kernelpack buffer), ``pack.warmup()``, two threads,
a fresh process, a forked child. Values are compared with NumPy in float64: normwise relative
error (max |got - ref| / max |ref|) <= 1e-5 for float32 results and 1e-12 for float64 ones.
Errors must name the parameter (or output) and must leave preallocated outputs untouched.

Every GPU test is marked ``gpu`` and skips with a reason where torch sees no CUDA device; the
one CPU test compiles, saves, loads and plans every fusion of this file (no GPU needed).
"""

# No `from __future__ import annotations`: the fusions below annotate with closure dtypes.

import copy
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp
from .torch_checks import check as _check, cuda as _cuda, host as _host
from .torch_checks import poisoned as _poisoned, targets, untouched as _untouched
from .torch_checks import NO_GPU as _NO_GPU, on_gpu, torch
from kernelpack.errors import ConstraintError, DeviceError, KernelPackError, LaunchError

TOL = {"float32": 1e-5, "complex64": 1e-5, "float64": 1e-12, "complex128": 1e-12}


# --------------------------------------------------------------------------------------------
# fusions


@kp.fusion
def r27_two(x: kp.Tensor[kp.f32, "n"], s: kp.f32):
    """Two outputs from one input: returned as a tuple."""
    return x * s, x + s


@kp.fusion
def r27_affine(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32, k: kp.i32):
    """A float and an int scalar parameter."""
    return x * s + k


@kp.fusion
def r27_softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
    z = x * s
    e = kp.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@kp.fusion
def r27_layernorm(x: kp.Tensor[kp.f64, "b", "n"], w: kp.Tensor[kp.f64, "n"],
                  bias: kp.Tensor[kp.f64, "n"], eps: kp.f64):
    d = x - x.mean(axis=-1, keepdims=True)
    var = (d * d).mean(axis=-1, keepdims=True)
    return d / kp.sqrt(var + eps) * w + bias


@kp.fusion
def r27_sum32(x: kp.Tensor[kp.f32, "n"]):
    return x.sum()


@kp.fusion
def r27_sum64(x: kp.Tensor[kp.f64, "n"]):
    return kp.sum(x)


def _encodings(dt):
    """Issue 3's quantum state encodings (bit k of index b is qubit k), written here from the
    issue's formulas: phase, angle and amplitude for a real ``dt``, basis to complex."""
    ct = kp.c64 if dt == kp.f32 else kp.c128

    @kp.fusion(name=f"r27_phase_{dt.name}")
    def phase(x: kp.Tensor[dt, "b", "n"]):
        # psi[b] = 2^(-n/2) exp(i sum_k x_k b_k), through the complex exp
        n = x.shape[1]
        size = 1 << n
        bits = (kp.arange(size)[:, None] >> kp.arange(n)[None, :]) & 1          # (N, n)
        phi = kp.where(bits[None, :, :] == 1, x[:, None, :], 0.0).sum(axis=-1)  # (B, N)
        return kp.exp(kp.complex(phi * 0.0, phi)) * (1.0 / size ** 0.5)

    @kp.fusion(name=f"r27_angle_{dt.name}")
    def angle(x: kp.Tensor[dt, "b", "n"]):
        # psi[b] = prod_k (b_k ? sin x_k : cos x_k)
        n = x.shape[1]
        bits = (kp.arange(1 << n)[:, None] >> kp.arange(n)[None, :]) & 1
        return kp.where(bits[None] == 1, kp.sin(x)[:, None, :],
                        kp.cos(x)[:, None, :]).prod(axis=-1)

    @kp.fusion(name=f"r27_basis_{dt.name}")
    def basis(j: kp.Tensor[kp.i64, "b"], n: kp.i64):
        # psi = e_j, complex
        return (kp.arange(1 << n)[None, :] == j[:, None]).astype(ct)

    @kp.fusion(name=f"r27_amplitude_{dt.name}")
    def amplitude(v: kp.Tensor[dt, "b", "l"], n: kp.i64):
        # psi = v / ||v||_2, zero-padded from L to N = 2^n
        inv = kp.rsqrt((v * v).sum(axis=-1, keepdims=True))
        return kp.pad(v * inv, 1 << n, axis=-1).astype(ct)

    return [phase, angle, basis, amplitude]


FUSIONS = [r27_two, r27_affine, r27_softmax, r27_layernorm, r27_sum32, r27_sum64,
           *_encodings(kp.f32), *_encodings(kp.f64)]
NAMES = [f.name for f in FUSIONS]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    """Every fusion of this file compiled once and saved to one file."""
    compiled = [kp.compile(f, targets=targets(_NO_GPU)) for f in FUSIONS]
    path = tmp_path_factory.mktemp("r27") / "r27.kpack"
    kp.save(compiled, path)
    return path


@pytest.fixture(scope="module")
def pack(artifact):
    return kp.load(artifact)


# --------------------------------------------------------------------------------------------
# helpers


def _softmax_ref(x: np.ndarray, s: float) -> np.ndarray:
    z = x.astype(np.float64) * s
    if z.size == 0:
        return z
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _layernorm_ref(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _bits(n: int) -> np.ndarray:
    idx = np.arange(1 << n)
    return (idx[:, None] >> np.arange(n)[None, :]) & 1


def _encoding_ref(name: str, args: tuple) -> np.ndarray:
    if name == "phase":
        (x,) = args
        n = x.shape[1]
        phi = x.astype(np.float64) @ _bits(n).T.astype(np.float64)
        return np.exp(1j * phi) * 2.0 ** (-n / 2)
    if name == "angle":
        (x,) = args
        x = x.astype(np.float64)
        bt = _bits(x.shape[1]).astype(bool)[None]
        return np.where(bt, np.sin(x)[:, None, :], np.cos(x)[:, None, :]).prod(-1)
    if name == "basis":
        j, n = args
        out = np.zeros((j.shape[0], 1 << n), np.complex128)
        out[np.arange(j.shape[0]), j] = 1
        return out
    v, n = args
    v = v.astype(np.float64)
    out = np.zeros((v.shape[0], 1 << n), np.complex128)
    out[:, :v.shape[1]] = v / np.linalg.norm(v, axis=-1, keepdims=True)
    return out


# --------------------------------------------------------------------------------------------
# CPU: every fusion traces, compiles for sm_90, saves, loads and plans


def test_every_fusion_compiles_for_sm_90_saves_loads_and_plans(artifact) -> None:
    pack = kp.load(artifact)
    assert sorted(pack.programs) == sorted(NAMES)
    plan = pack["r27_two"].plan(x=(7,), s=0.5)
    assert [a.shape for a in plan.allocations.values() if a.kind == "output"] == [(7,), (7,)]
    for dt, ct in (("float32", kp.complex64), ("float64", kp.complex128)):
        out = pack[f"r27_phase_{dt}"].plan(x=(3, 6)).allocations["out"]
        assert out.shape == (3, 64) and out.dtype == ct
        assert pack[f"r27_basis_{dt}"].plan(j=(3,), n=5).allocations["out"].shape == (3, 32)
        assert pack[f"r27_amplitude_{dt}"].plan(v=(3, 4), n=2).allocations["out"].shape == (3, 4)
    assert pack["r27_sum32"].plan(x=(0,)).allocations["out"].shape == ()
    # the long rows of the GPU tests take a split variant (scratch), the others none
    assert any(a.kind == "scratch"
               for a in pack["r27_softmax"].plan(x=(3, 70000), s=1.0).allocations.values())
    assert all(a.kind == "output"
               for a in pack["r27_softmax"].plan(x=(64, 1000), s=1.0).allocations.values())
    with pytest.raises(ConstraintError):
        pack["r27_layernorm"].plan(x=(3, 5), w=(5,), bias=(4,), eps=1e-5)
    with pytest.raises(ConstraintError):  # kp.pad: L = 5 does not fit N = 4
        pack["r27_amplitude_float32"].plan(v=(3, 5), n=2)


# --------------------------------------------------------------------------------------------
# torch in, torch out; shapes; several outputs


@on_gpu
@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 13, 31, 127, 257, 8191, 65537, 1_000_003])
def test_two_outputs_come_back_as_a_tuple_of_torch_tensors(pack, n) -> None:
    rng = np.random.default_rng(n)
    xh = rng.standard_normal(n).astype(np.float32)
    x = _cuda(xh)
    res = pack["r27_two"](x, 0.375)
    assert isinstance(res, tuple) and len(res) == 2
    for t in res:
        assert isinstance(t, torch.Tensor) and t.device == x.device
        assert t.dtype == torch.float32 and tuple(t.shape) == (n,)
    _check(_host(res[0]), xh.astype(np.float64) * 0.375, 1e-5, f"x*s n={n}")
    _check(_host(res[1]), xh.astype(np.float64) + 0.375, 1e-5, f"x+s n={n}")
    a, b = _poisoned((n,)), _poisoned((n,))
    got = pack["r27_two"](x, -2.5, out=(a, b))
    assert got[0] is a and got[1] is b
    _check(_host(a), xh.astype(np.float64) * -2.5, 1e-5, f"out= x*s n={n}")
    _check(_host(b), xh.astype(np.float64) - 2.5, 1e-5, f"out= x+s n={n}")


@on_gpu
def test_a_fresh_process_loads_the_file_and_compiles_nothing(artifact, tmp_path) -> None:
    xh = np.random.default_rng(1).standard_normal(1009).astype(np.float32)
    np.save(tmp_path / "x.npy", xh)
    script = textwrap.dedent("""
        import json, sys
        import numpy as np, torch
        import kernelpack as kp
        pack = kp.load(sys.argv[1])
        x = torch.from_numpy(np.load(sys.argv[2])).cuda()
        a, b = pack["r27_two"](x, 0.75)
        c = pack["r27_softmax"](x.view(1, -1), 2.0)
        torch.cuda.synchronize()
        np.save(sys.argv[3], np.stack([a.cpu().numpy(), b.cpu().numpy(),
                                       c.cpu().numpy().ravel()]))
        heavy = sorted(m for m in sys.modules
                       if m.split(".")[0] == "llvmlite" or m.startswith("kernelpack.lowering"))
        print(json.dumps({"programs": sorted(pack.programs), "heavy": heavy}))
    """)
    env = dict(os.environ)
    src = str(Path(kp.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-c", script, str(artifact), str(tmp_path / "x.npy"),
                           str(tmp_path / "r.npy")], capture_output=True, text=True,
                          timeout=180, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["programs"] == sorted(NAMES)
    assert report["heavy"] == [], f"the load path imported the compiler: {report['heavy']}"
    r = np.load(tmp_path / "r.npy")
    x64 = xh.astype(np.float64)
    _check(r[0], x64 * 0.75, 1e-5, "child x*s")
    _check(r[1], x64 + 0.75, 1e-5, "child x+s")
    _check(r[2], _softmax_ref(xh[None], 2.0)[0], 1e-5, "child softmax")


@on_gpu
def test_the_same_file_loaded_twice_gives_two_working_packs(artifact) -> None:
    p1, p2 = kp.load(str(artifact)), kp.load(Path(artifact))
    xh = np.linspace(-3, 3, 4099, dtype=np.float32)
    x = _cuda(xh)
    for p in (p1, p2, p1):
        a, b = p["r27_two"](x, 3.0)
        _check(_host(a), xh.astype(np.float64) * 3.0, 1e-5, "x*s")
        _check(_host(b), xh.astype(np.float64) + 3.0, 1e-5, "x+s")


# --------------------------------------------------------------------------------------------
# layouts and argument errors


@on_gpu
def test_non_contiguous_inputs_are_refused_naming_the_parameter(pack) -> None:
    base = torch.randn(64, 130, device="cuda")
    out = _poisoned((65,))
    with pytest.raises(LaunchError, match=r"'x'.*contiguous"):
        pack["r27_two"](base[0, ::2], 1.0, out=(out, out.clone()))
    with pytest.raises(LaunchError, match=r"'x'.*contiguous"):
        pack["r27_two"](base[:, 3], 1.0)  # a column: stride 130
    with pytest.raises(LaunchError, match=r"'x'.*contiguous"):
        pack["r27_two"](torch.randn(1, device="cuda").expand(50), 1.0)  # stride 0
    y = _poisoned((130, 64))
    with pytest.raises(LaunchError, match=r"'x'.*contiguous"):
        pack["r27_softmax"](base.t(), 1.0, out=y)
    with pytest.raises(LaunchError, match=r"'x'.*contiguous"):
        pack["r27_affine"](base[:, :100], 1.0, 2)  # rows of 100 in rows of 130
    assert _untouched(out, y)
    x64 = torch.randn(4, 33, dtype=torch.float64, device="cuda")
    w = torch.randn(66, dtype=torch.float64, device="cuda")[::2]
    bias = torch.zeros(33, dtype=torch.float64, device="cuda")
    with pytest.raises(LaunchError, match=r"'w'.*contiguous"):
        pack["r27_layernorm"](x64, w, bias, 1e-5)


@on_gpu
def test_contiguous_views_at_odd_offsets_compute_right(pack) -> None:
    """Views that are C-contiguous (torch says so) but start 4 bytes past a 16-byte boundary,
    or have a size-1 dim with a large stride, are accepted and computed right."""
    flat = torch.randn(3 * 1025 + 5, device="cuda")
    x = flat[1:1 + 3 * 1025].view(3, 1025)
    assert x.is_contiguous() and x.data_ptr() % 16 == 4
    xh = _host(x).copy()
    _check(_host(pack["r27_softmax"](x, 0.5)), _softmax_ref(xh, 0.5), 1e-5, "offset softmax")
    v = flat[3:3 + 1001]
    a, _ = pack["r27_two"](v, 2.0)
    _check(_host(a), _host(v).astype(np.float64) * 2.0, 1e-5, "offset x*s")
    wide = torch.randn(5, 100, device="cuda")
    row = wide[2:3, 7:14]  # shape (1, 7), strides (100, 1): contiguous in torch's sense
    assert row.is_contiguous()
    _check(_host(pack["r27_affine"](row, 2.0, 1)),
           _host(row).astype(np.float64) * 2.0 + 1, 1e-5, "size-1 dim with a large stride")
    _check(_host(pack["r27_softmax"](row, 1.0)), _softmax_ref(_host(row), 1.0), 1e-5,
           "softmax of a (1, 7) view")


@on_gpu
def test_wrong_dtype_and_device_name_the_parameter(pack) -> None:
    x = torch.randn(16, device="cuda")
    out = (_poisoned((16,)), _poisoned((16,)))
    with pytest.raises(LaunchError, match=r"'x'.*float64.*float32"):
        pack["r27_two"](x.double(), 1.0, out=out)
    with pytest.raises(LaunchError, match=r"'x'"):
        pack["r27_two"](x.half(), 1.0, out=out)
    with pytest.raises(LaunchError, match=r"'x'"):
        pack["r27_two"](x.to(torch.int32), 1.0, out=out)
    with pytest.raises(LaunchError, match=r"'x'"):
        pack["r27_two"](x.cpu(), 1.0, out=out)  # a CPU tensor
    with pytest.raises(LaunchError, match=r"'x'"):
        pack["r27_two"](np.ones(16, np.float32), 1.0, out=out)  # a NumPy (host) array
    assert _untouched(*out)
    x64 = torch.randn(4, 8, dtype=torch.float64, device="cuda")
    w = torch.ones(8, dtype=torch.float64, device="cuda")
    with pytest.raises(LaunchError, match=r"'w'"):
        pack["r27_layernorm"](x64, w.cpu(), w, 1e-5)
    with pytest.raises(LaunchError, match=r"'bias'.*float32"):
        pack["r27_layernorm"](x64, w, w.float(), 1e-5)
    with pytest.raises(LaunchError, match=r"'j'.*int32"):
        pack["r27_basis_float32"](torch.zeros(3, dtype=torch.int32, device="cuda"), 2)


@on_gpu
def test_wrong_rank_is_a_launch_error_naming_the_parameter(pack) -> None:
    """README: "Wrong dtype, rank, device or layout raise LaunchError naming the parameter"."""
    with pytest.raises(LaunchError, match=r"\bx\b"):
        pack["r27_two"](torch.randn(4, 4, device="cuda"), 1.0)
    with pytest.raises(LaunchError, match=r"\bx\b"):
        pack["r27_softmax"](torch.randn(8, device="cuda"), 1.0)
    with pytest.raises(LaunchError, match=r"\bw\b"):
        pack["r27_layernorm"](torch.randn(2, 3, dtype=torch.float64, device="cuda"),
                              torch.ones(1, 3, dtype=torch.float64, device="cuda"),
                              torch.ones(3, dtype=torch.float64, device="cuda"), 1e-5)


@on_gpu
def test_mismatched_shapes_are_constraint_errors(pack) -> None:
    x = torch.randn(4, 8, dtype=torch.float64, device="cuda")
    w = torch.ones(8, dtype=torch.float64, device="cuda")
    with pytest.raises(ConstraintError):
        pack["r27_layernorm"](x, w, torch.ones(7, dtype=torch.float64, device="cuda"), 1e-5)
    with pytest.raises(ConstraintError):  # L = 5 does not fit N = 4
        pack["r27_amplitude_float32"](torch.ones(3, 5, device="cuda"), 2)


# --------------------------------------------------------------------------------------------
# out=


@on_gpu
def test_out_as_one_array_tuple_list_and_dict(pack) -> None:
    prog = pack["r27_two"]
    names = [t.name for t in prog.summary.outputs]
    assert len(names) == 2
    xh = np.random.default_rng(5).standard_normal(777).astype(np.float32)
    x = _cuda(xh)
    x64 = xh.astype(np.float64)
    for k, make in enumerate((lambda a, b: (a, b), lambda a, b: [a, b],
                              lambda a, b: {names[0]: a, names[1]: b},
                              lambda a, b: {names[1]: b, names[0]: a})):
        a, b = _poisoned((777,)), _poisoned((777,))
        s = 0.5 + k
        got = prog(x, s, out=make(a, b))
        assert isinstance(got, tuple) and got[0] is a and got[1] is b
        _check(_host(a), x64 * s, 1e-5, f"out form {k}: first")
        _check(_host(b), x64 + s, 1e-5, f"out form {k}: second")
    y = _poisoned((3, 50))
    xs = torch.randn(3, 50, device="cuda")
    assert pack["r27_softmax"](xs, 1.0, out=y) is y
    _check(_host(y), _softmax_ref(_host(xs), 1.0), 1e-5, "single out=")
    r = torch.full((), float("nan"), device="cuda")
    assert pack["r27_sum32"](x, out=r) is r
    _check(_host(r), np.asarray(x64.sum()), 1e-5, "0-d out=")


@on_gpu
def test_out_errors_name_the_output_and_write_nothing(pack) -> None:
    prog = pack["r27_two"]
    n0, n1 = [t.name for t in prog.summary.outputs]
    x = torch.randn(100, device="cuda")
    a, b = _poisoned((100,)), _poisoned((100,))
    with pytest.raises(LaunchError, match=rf"'{n1}'.*shape"):
        prog(x, 1.0, out=(a, _poisoned((101,))))
    with pytest.raises(LaunchError, match=rf"'{n0}'.*dtype"):
        prog(x, 1.0, out=(_poisoned((100,), torch.float64), b))
    with pytest.raises(LaunchError, match=rf"'{n1}'"):
        prog(x, 1.0, out=(a, b.cpu()))
    with pytest.raises(LaunchError, match=rf"'{n1}'.*contiguous"):
        prog(x, 1.0, out=(a, _poisoned((200,))[::2]))
    with pytest.raises(LaunchError, match="overlap"):
        prog(x, 1.0, out=(a, a))
    with pytest.raises((TypeError, KernelPackError)):
        prog(x, 1.0, out=(a,))  # one array for two outputs
    with pytest.raises((TypeError, KernelPackError)):
        prog(x, 1.0, out=a)
    with pytest.raises((TypeError, KernelPackError), match=n1):
        prog(x, 1.0, out={n0: a})
    with pytest.raises((TypeError, KernelPackError), match="nope"):
        prog(x, 1.0, out={n0: a, n1: b, "nope": _poisoned((100,))})
    assert _untouched(a, b)


@on_gpu
def test_out_overlapping_an_input_is_refused_and_exact_in_place_works(pack) -> None:
    prog = pack["r27_affine"]
    buf = torch.randn(2 * 4 * 33 + 1, device="cuda")
    x = buf[:4 * 33].view(4, 33)
    with pytest.raises(LaunchError):
        prog(x, 2.0, 1, out=buf[1:1 + 4 * 33].view(4, 33))  # partial overlap: a race
    xh = _host(x).astype(np.float64).copy()
    assert prog(x, 2.0, 1, out=x) is x  # the very same array: in place
    _check(_host(x), xh * 2.0 + 1, 1e-5, "in place")


# --------------------------------------------------------------------------------------------
# keywords and scalars


@on_gpu
def test_keyword_arguments_match_positional_ones(pack) -> None:
    prog = pack["r27_affine"]
    x = torch.randn(5, 19, device="cuda")
    ref = _host(x).astype(np.float64) * 0.25 + 3
    for got in (prog(x, 0.25, 3), prog(x=x, s=0.25, k=3), prog(x, s=0.25, k=3),
                prog(x, k=3, s=0.25), prog(k=3, x=x, s=0.25)):
        _check(_host(got), ref, 1e-5, "keywords")
    y = _poisoned((5, 19))
    assert prog(x, k=3, s=0.25, out=y) is y
    _check(_host(y), ref, 1e-5, "keywords with out=")
    with pytest.raises(TypeError, match="'q'"):
        prog(x, 0.25, q=3)
    with pytest.raises(TypeError, match="'s'"):
        prog(x, 0.25, 3, s=0.5)
    with pytest.raises(TypeError):
        prog(x, 0.25)  # k missing


@on_gpu
def test_scalar_kinds(pack) -> None:
    prog = pack["r27_affine"]
    x = torch.randn(3, 41, device="cuda")
    xh = _host(x).astype(np.float64)
    for s in (2, 2.5, np.float32(2.5), np.float64(-1.25), np.int64(3), np.float16(0.5),
              torch.tensor(1.5), torch.tensor(0.75, device="cuda")):
        expect = float(s)
        for _ in range(2):  # the first call binds, the second takes the warm path
            try:
                got = prog(x, s, 1)
            except (TypeError, LaunchError) as exc:  # a 0-d tensor may be refused ...
                assert isinstance(s, torch.Tensor), f"s={s!r} ({type(s).__name__}): {exc}"
                assert "'s'" in str(exc), exc  # ... naming the parameter
                break
            _check(_host(got), xh * expect + 1, 1e-5, f"s={s!r} ({type(s).__name__})")
    for k in (1, np.int32(-7), np.int64(2 ** 20), np.uint8(200)):
        got = prog(x, 1.0, k)
        _check(_host(got), xh + int(k), 1e-5, f"k={k!r} ({type(k).__name__})")
    with pytest.raises(TypeError, match="'k'"):
        prog(x, 1.0, 1.5)  # a float for an integer parameter
    with pytest.raises(ConstraintError, match="'k'"):
        prog(x, 1.0, 2 ** 31)  # does not fit int32
    with pytest.raises(TypeError, match="'s'"):
        prog(x, "2.0", 1)
    with pytest.raises(TypeError, match="'n'"):
        pack["r27_basis_float64"](torch.zeros(3, dtype=torch.int64, device="cuda"), 3.0)


# --------------------------------------------------------------------------------------------
# streams and graphs


@on_gpu
def test_stream_orders_a_chain_of_launches(pack) -> None:
    prog = pack["r27_affine"]
    xh = np.random.default_rng(2).random((256, 1023), dtype=np.float32)
    x = _cuda(xh)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    y = x
    ref = xh.copy()
    for _ in range(20):  # each launch reads the previous one's output, on s
        y = prog(y, 0.5, 1, stream=s)
        ref = ref * np.float32(0.5) + np.float32(1)
    with torch.cuda.stream(s):  # torch work queued after them on s sees their result
        w = y * 3
    s.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), ref)
    np.testing.assert_array_equal(w.cpu().numpy(), ref * np.float32(3))
    out = _poisoned((256, 1023))
    s.wait_stream(torch.cuda.current_stream())
    assert prog(x, 2.0, -1, out=out, stream=s.cuda_stream) is out  # a raw handle
    s.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), xh * np.float32(2) - np.float32(1))
    with torch.cuda.stream(s):  # no stream=: torch's current stream
        z = prog(x, 4.0, 0)
    s.synchronize()
    np.testing.assert_array_equal(z.cpu().numpy(), xh * np.float32(4))
    for bad in (1.5, True):
        with pytest.raises(TypeError):
            prog(x, 1.0, 0, stream=bad)


@on_gpu
def test_graph_capture_with_out_replays_on_new_data(pack) -> None:
    two, sm = pack["r27_two"], pack["r27_softmax"]
    n0, n1 = [t.name for t in two.summary.outputs]
    x = torch.randn(4097, device="cuda")
    a, b = torch.empty_like(x), torch.empty_like(x)
    xs = torch.randn(64, 1000, device="cuda")
    ys = torch.empty_like(xs)
    two(x, 1.5, out=(a, b))  # bind and load outside the capture
    sm(xs, 0.5, out=ys)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        two(x, 1.5, out={n0: a, n1: b})
        sm(xs, 0.5, out=ys)
    rng = np.random.default_rng(3)
    for trial in range(3):
        xh = rng.standard_normal(4097).astype(np.float32)
        xsh = rng.standard_normal((64, 1000)).astype(np.float32) * (trial + 1)
        x.copy_(_cuda(xh))
        xs.copy_(_cuda(xsh))
        for t in (a, b, ys):
            t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check(_host(a), xh.astype(np.float64) * 1.5, 1e-5, f"replay {trial}: x*s")
        _check(_host(b), xh.astype(np.float64) + 1.5, 1e-5, f"replay {trial}: x+s")
        _check(_host(ys), _softmax_ref(xsh, 0.5), 1e-5, f"replay {trial}: softmax")


# --------------------------------------------------------------------------------------------
# other array types


@on_gpu
def test_cupy_in_cupy_out(pack) -> None:
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    xh = np.random.default_rng(4).standard_normal(3001).astype(np.float32)
    x = cupy.asarray(xh)
    a, b = pack["r27_two"](x, 0.5)
    assert isinstance(a, cupy.ndarray) and isinstance(b, cupy.ndarray)
    _check(cupy.asnumpy(a), xh.astype(np.float64) * 0.5, 1e-5, "cupy x*s")
    _check(cupy.asnumpy(b), xh.astype(np.float64) + 0.5, 1e-5, "cupy x+s")
    oa, ob = cupy.full(3001, cupy.nan, cupy.float32), cupy.full(3001, cupy.nan, cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()  # the NaN fills ran on the default stream
    got = pack["r27_two"](x, 2.0, out=[oa, ob], stream=s)
    assert got[0] is oa and got[1] is ob
    s.synchronize()
    _check(cupy.asnumpy(oa), xh.astype(np.float64) * 2.0, 1e-5, "cupy out x*s")
    xs = cupy.asarray(np.random.default_rng(5).standard_normal((3, 70000)).astype(np.float32))
    y = pack["r27_softmax"](xs, 1.0)  # a split variant with scratch
    assert isinstance(y, cupy.ndarray)
    _check(cupy.asnumpy(y), _softmax_ref(cupy.asnumpy(xs), 1.0), 1e-5, "cupy softmax")
    with pytest.raises(LaunchError, match="'x'"):
        pack["r27_two"](x.astype(cupy.float64), 1.0)


class _CAI:
    """Only ``__cuda_array_interface__`` (no torch, no DLPack)."""

    def __init__(self, t) -> None:
        self._t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


class _DL:
    """Only DLPack."""

    def __init__(self, t) -> None:
        self._t = t

    def __dlpack__(self, stream=None, **kw):
        return self._t.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


@on_gpu
@pytest.mark.parametrize("wrap", [_CAI, _DL], ids=["cuda_array_interface", "dlpack"])
def test_a_foreign_array_gets_kernelpack_buffers_back(pack, wrap) -> None:
    xh = np.random.default_rng(6).standard_normal(1000).astype(np.float32)
    x = _cuda(xh)
    torch.cuda.synchronize()
    res = pack["r27_two"](wrap(x), 0.5)
    assert isinstance(res, tuple) and len(res) == 2
    x64 = xh.astype(np.float64)
    for buf, ref in zip(res, (x64 * 0.5, x64 + 0.5)):
        assert not isinstance(buf, torch.Tensor)
        assert hasattr(buf, "__dlpack__") and hasattr(buf, "__cuda_array_interface__")
        cai = buf.__cuda_array_interface__
        assert tuple(cai["shape"]) == (1000,) and cai["typestr"] == "<f4"
        _check(_host(torch.from_dlpack(buf)), ref, 1e-5, "from_dlpack")
        host = np.asarray(buf)  # a copy to the host
        _check(host, ref, 1e-5, "np.asarray")
        assert bytes(buf.copy_to_host()) == host.tobytes()
        for refuse in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises((TypeError, KernelPackError)):
                refuse(buf)
    again = pack["r27_two"](res[0], 2.0)  # a kernelpack buffer as an input
    _check(np.asarray(again[0]), x64 * 0.5 * 2.0, 1e-5, "buffer in, buffer out")
    y = pack["r27_softmax"](wrap(x.view(4, 250)), 1.0)
    _check(np.asarray(y), _softmax_ref(xh.reshape(4, 250), 1.0), 1e-5, "foreign softmax")


@on_gpu
def test_warmup_then_calls(artifact) -> None:
    p = kp.load(artifact)
    p.warmup()
    p.warmup()  # twice is harmless
    p.warmup(devices=[torch.cuda.current_device()])
    p["r27_sum64"].warmup()
    x = torch.arange(10, dtype=torch.float64, device="cuda")
    assert float(p["r27_sum64"](x)) == 45.0
    a, _ = p["r27_two"](x.float(), 2.0)
    _check(_host(a), np.arange(10.0) * 2, 1e-5, "after warmup")


# --------------------------------------------------------------------------------------------
# workloads


@on_gpu
@pytest.mark.parametrize("dt", ["float32", "float64"])
@pytest.mark.parametrize("name", ["phase", "angle", "basis", "amplitude"])
def test_quantum_encodings_match_numpy(pack, name, dt) -> None:
    prog = pack[f"r27_{name}_{dt}"]
    npdt = np.float32 if dt == "float32" else np.float64
    ctol = TOL["complex64" if dt == "float32" else "complex128"]
    rng = np.random.default_rng(zlib.crc32(f"{name}/{dt}".encode()))
    B = 3
    for n in range(7):  # n = 0 too: N = 1, psi = [1]
        N = 1 << n
        if name in ("phase", "angle"):
            # phase: angles in [0, 2) keep the float32 sum of n phases well inside 1e-5
            scale, shift = (2.0, 0.0) if name == "phase" else (2 * np.pi, -np.pi)
            xh = (rng.random((B, n)) * scale + shift).astype(npdt)
            got = prog(_cuda(xh))
            ref = _encoding_ref(name, (xh,))
            tol = ctol if name == "phase" else TOL[dt]
            _check(_host(got), ref, tol, f"{name} {dt} n={n}")
        elif name == "basis":
            j = rng.integers(0, N, size=B, dtype=np.int64)
            got = _host(prog(_cuda(j), n))
            assert got.shape == (B, N)
            np.testing.assert_array_equal(got, _encoding_ref(name, (j, n)), f"basis n={n}")
        else:
            for L in sorted({1, max(1, N - 1), N}):
                v = rng.standard_normal((B, L)).astype(npdt)
                got = prog(_cuda(v), n)
                _check(_host(got), _encoding_ref(name, (v, n)), ctol,
                       f"amplitude {dt} n={n} L={L}")


_ROWS = [(3, 1), (3, 31), (3, 1025), (3, 70000), (257, 1025), (0, 31), (3, 0)]


@on_gpu
@pytest.mark.parametrize("shape", _ROWS, ids=[f"{b}x{n}" for b, n in _ROWS])
def test_softmax_rows(pack, shape) -> None:
    xh = (np.random.default_rng(sum(shape)).standard_normal(shape) * 3).astype(np.float32)
    got = pack["r27_softmax"](_cuda(xh), 1.7)
    assert tuple(got.shape) == shape and got.dtype == torch.float32
    _check(_host(got), _softmax_ref(xh, np.float64(np.float32(1.7))), 1e-5, f"softmax {shape}")
    y = _poisoned(shape)
    assert pack["r27_softmax"](_cuda(xh), 1.7, out=y) is y
    _check(_host(y), _softmax_ref(xh, np.float64(np.float32(1.7))), 1e-5, f"out= {shape}")


@on_gpu
@pytest.mark.parametrize("shape", _ROWS, ids=[f"{b}x{n}" for b, n in _ROWS])
def test_layernorm_rows_float64(pack, shape) -> None:
    rng = np.random.default_rng(sum(shape) + 1)
    b, n = shape
    xh = rng.standard_normal(shape) * 2 + 0.5
    w = rng.standard_normal(n)
    bias = rng.standard_normal(n)
    got = pack["r27_layernorm"](_cuda(xh), _cuda(w), _cuda(bias), 1e-5)
    assert tuple(got.shape) == shape and got.dtype == torch.float64
    if b and n:
        _check(_host(got), _layernorm_ref(xh, w, bias, 1e-5), 1e-12, f"layernorm {shape}")


@on_gpu
@pytest.mark.parametrize("n", [0, 1, 2, 1 << 20, (1 << 20) + 3])
@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_full_sum(pack, n, dt) -> None:
    npdt = np.float32 if dt == "float32" else np.float64
    xh = np.random.default_rng(n).random(n).astype(npdt) + npdt(0.5)
    got = pack["r27_sum32" if dt == "float32" else "r27_sum64"](_cuda(xh))
    assert tuple(got.shape) == () and str(got.dtype) == f"torch.{dt}"
    ref = np.asarray(xh.astype(np.float64).sum())
    if n <= 1:
        assert float(got) == float(ref)  # 0 for an empty sum, the element itself for one
    _check(_host(got), ref, TOL[dt], f"sum {dt} n={n}")


# --------------------------------------------------------------------------------------------
# threads and processes


@on_gpu
def test_two_threads_launch_one_program_at_once(pack) -> None:
    sm, two = pack["r27_softmax"], pack["r27_two"]
    rng = np.random.default_rng(8)
    xhs = [rng.standard_normal((3, 70000)).astype(np.float32),   # split variant, scratch
           rng.standard_normal((64, 1025)).astype(np.float32)]   # a block per row
    vhs = [rng.standard_normal(5003).astype(np.float32), rng.standard_normal(70001)
           .astype(np.float32)]
    xs, vs = [_cuda(h) for h in xhs], [_cuda(h) for h in vhs]
    scales = [0.5, 2.0]
    torch.cuda.synchronize()
    barrier = threading.Barrier(2, timeout=60)
    results: dict = {}
    errors: list = []

    def work(i: int) -> None:
        try:
            s = torch.cuda.Stream()
            outs = (torch.empty_like(vs[i]), torch.empty_like(vs[i]))
            with torch.cuda.stream(s):
                barrier.wait()
                ys = [sm(xs[i], scales[i]) for _ in range(25)]
                for _ in range(25):
                    two(vs[i], scales[i], out=outs)
            s.synchronize()
            results[i] = (ys[0], ys[-1], outs)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    assert not errors, errors
    for i in range(2):
        first, last, (a, b) = results[i]
        ref = _softmax_ref(xhs[i], scales[i])
        _check(_host(first), ref, 1e-5, f"thread {i} first softmax")
        _check(_host(last), ref, 1e-5, f"thread {i} last softmax")
        _check(_host(a), vhs[i].astype(np.float64) * scales[i], 1e-5, f"thread {i} x*s")
        _check(_host(b), vhs[i].astype(np.float64) + scales[i], 1e-5, f"thread {i} x+s")


def _forked_call(conn, prog, x) -> None:  # pragma: no cover - runs in the forked child
    try:
        prog(x, 1.0)
        conn.send(("no error", ""))
    except BaseException as exc:  # reported to the parent
        conn.send(([c.__name__ for c in type(exc).__mro__], str(exc)))
    finally:
        conn.close()
        os._exit(0)


@on_gpu
@pytest.mark.skipif(sys.platform != "linux", reason="fork start method: Linux only")
def test_a_forked_child_gets_a_device_error(pack) -> None:
    """README: in a child forked after the parent initialized CUDA, a launch raises
    DeviceError."""
    x = torch.randn(64, device="cuda")
    pack["r27_two"](x, 1.0)  # CUDA initialized, the program bound
    torch.cuda.synchronize()
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_forked_call, args=(child, pack["r27_two"], x))
    proc.start()
    child.close()
    ready = parent.poll(60)
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join()
    assert ready, "the forked child did not answer within 60 s (a hang instead of DeviceError)"
    try:
        kinds, message = parent.recv()
    except EOFError:
        pytest.fail(f"the forked child died without answering (exit code {proc.exitcode})")
    assert DeviceError.__name__ in kinds, f"the child's call gave {kinds}: {message}"
