"""A tiny SIMT emulator: run the lowering's kernels on the CPU, so CI (no GPU) checks numerics.

The kernels' LLVM IR (before PTX) is retargeted to the host: special registers, warp shuffles
and barriers become calls into Python, shared memory a plain global, libdevice functions the
host's libm. Every GPU thread of a block runs as an OS thread (ctypes releases the GIL while
JIT-compiled code runs), so shuffles and ``bar.sync`` have their real cooperative semantics.
Only small launches are practical; that is all tests need.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import re
import sys
import threading
from typing import Any, Callable
from functools import lru_cache

import llvmlite.binding as llvm
import numpy as np

import kernelpack as kp
from kernelpack.lowering import pipeline
from kernelpack.planner import Planner

__all__ = ["run_fusion", "Kernels", "assert_close", "guarded", "GUARD"]

_NP = {"bool": np.bool_, "int8": np.int8, "int16": np.int16, "int32": np.int32,
       "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
       "uint64": np.uint64, "float16": np.float16, "bfloat16": np.uint16,
       "float32": np.float32, "float64": np.float64, "complex64": np.complex64,
       "complex128": np.complex128}
_CT = {"bool": ctypes.c_bool, "int8": ctypes.c_int8, "int16": ctypes.c_int16,
       "int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint8": ctypes.c_uint8,
       "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64,
       "float32": ctypes.c_float, "float64": ctypes.c_double}

# The emulator's callbacks are registered with LLVM process-wide (llvm.add_symbol) and read
# this module's thread-local state: a second copy of the module (imported under another name,
# e.g. ``simt`` beside ``lowering.simt``) re-registers them, and kernels run by the first copy
# then read registers nobody set: a stride of 0, threads spinning forever (session 28's CI
# hang). Refuse a second copy instead.
for _other in list(sys.modules.values()):
    if (getattr(_other, "__file__", None) == __file__ and _other.__name__ != __name__
            and hasattr(_other, "_state")):
        raise ImportError(f"tests/lowering/simt.py is already imported as {_other.__name__!r}; "
                          f"import it under that name (not {__name__!r}): its LLVM callbacks "
                          f"are process-wide")

_state = threading.local()
_I32 = ctypes.CFUNCTYPE(ctypes.c_int32)


def _sreg(name: str):
    return _I32(lambda: getattr(_state, name))


@ctypes.CFUNCTYPE(None)
def _barrier():
    _state.block_barrier.wait()


@ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)
def _shfl(mask, value, lanemask, clamp):
    warp = _state.warp
    lane = _state.tid % 32
    warp.values[lane] = value
    warp.barrier.wait()
    other = warp.values[lane ^ lanemask]
    warp.barrier.wait()
    return other


@ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_float)
def _rsqrtf(x):
    return float(np.float32(1.0) / np.sqrt(np.float32(x))) if x > 0 else (
        math.copysign(math.inf, x) if x == 0 else math.nan)  # rsqrt(-0) = -inf, as the GPU


@ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)
def _rsqrt(x):
    return 1.0 / math.sqrt(x) if x > 0 else (math.copysign(math.inf, x) if x == 0 else math.nan)


_CALLBACKS = {"kp_tid": _sreg("tid"), "kp_ctaid": _sreg("ctaid"), "kp_ntid": _sreg("ntid"),
              "kp_nctaid": _sreg("nctaid"), "kp_shfl": _shfl, "kp_barrier": _barrier,
              "__nv_rsqrtf": _rsqrtf, "__nv_rsqrt": _rsqrt}
_LIBM = ("exp", "exp2", "log", "log2", "sqrt", "sin", "cos", "tan", "tanh", "erf", "pow",
         "floor", "ceil", "fabs", "hypot", "sincos", "fmod")


@lru_cache(maxsize=1)
def _host():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    for name in _LIBM:
        for suffix in ("f", ""):
            llvm.add_symbol(f"__nv_{name}{suffix}",
                            ctypes.cast(getattr(libm, name + suffix), ctypes.c_void_p).value)
    for name, cb in _CALLBACKS.items():
        llvm.add_symbol(name, ctypes.cast(cb, ctypes.c_void_p).value)
    # x86 code generation calls libgcc's helpers for what the CPU lacks (half conversions,
    # 128-bit division); the JIT finds them only in libraries loaded with global symbols and
    # otherwise links address 0 without a word: the process dies when the kernel runs
    gcc_s = ctypes.util.find_library("gcc_s")
    if gcc_s:
        llvm.load_library_permanently(gcc_s)
    return True


def _to_host(ir_text: str) -> str:
    text = re.sub(r'target (triple|datalayout) = "[^"]*"\n', "", ir_text)
    for reg in ("tid", "ctaid", "ntid", "nctaid"):
        text = text.replace(f'"llvm.nvvm.read.ptx.sreg.{reg}.x"', f'"kp_{reg}"')
    text = text.replace('"llvm.nvvm.shfl.sync.bfly.i32"', '"kp_shfl"')
    text = text.replace('"llvm.nvvm.barrier0"', '"kp_barrier"')
    text = text.replace("ptx_kernel ", "").replace(" addrspace(3)", "")
    text = text.replace("addrspacecast", "bitcast")
    if "bfloat" in text:  # x86 lowers fptrunc to bfloat as a call to compiler-rt's
        text += _TRUNCSFBF2   # __truncsfbf2, which this process has no library for
    if "half" in text:  # and double -> half (F16C converts only from float) to libgcc's
        text += _TRUNCDFHF2   # __truncdfhf2, which libgcc older than GCC 12 lacks (_host
    return text               # loads libgcc_s for the helpers it does have)


# float32 -> bfloat16, rounding to nearest even (NaN: the quiet 0x7FC0)
_TRUNCSFBF2 = """
define bfloat @__truncsfbf2(float %x) {
  %bits = bitcast float %x to i32
  %hi = lshr i32 %bits, 16
  %lsb = and i32 %hi, 1
  %bias = add i32 %lsb, 32767
  %sum = add i32 %bits, %bias
  %top = lshr i32 %sum, 16
  %nan = fcmp uno float %x, %x
  %r = select i1 %nan, i32 32704, i32 %top
  %h = trunc i32 %r to i16
  %b = bitcast i16 %h to bfloat
  ret bfloat %b
}
"""

# float64 -> float16, rounding to nearest even once: to float32 rounding *to odd* (an inexact
# result is the float32 value towards zero with its last bit set), after which F16C's one
# rounding to 11 bits is exact; NaN and infinities pass through, finite values beyond
# float32's range become its largest (odd) value, which float16 rounds to infinity.
_TRUNCDFHF2 = """
define half @__truncdfhf2(double %x) {
  %f = fptrunc double %x to float
  %back = fpext float %f to double
  %inexact = fcmp one double %back, %x
  %neg = fcmp olt double %x, 0.0
  %below = fcmp olt double %back, %x
  %above = fcmp ogt double %back, %x
  %away = select i1 %neg, i1 %below, i1 %above
  %bits = bitcast float %f to i32
  %dec = sub i32 %bits, 1
  %toward = select i1 %away, i32 %dec, i32 %bits
  %odd = or i32 %toward, 1
  %r = select i1 %inexact, i32 %odd, i32 %bits
  %rf = bitcast i32 %r to float
  %h = fptrunc float %rf to half
  ret half %h
}
"""


class _Warp:
    def __init__(self) -> None:
        self.values = [0] * 32
        self.barrier = threading.Barrier(32)


# x86 instructions that convert float to bfloat16 in hardware (AVX512-BF16's VCVTNEPS2BF16,
# AVX-NE-CONVERT's VCVTNEPS2BF16) flush subnormal inputs and results to zero, which a GPU's
# cvt.rn.bf16.f32 does not: with them (an AMD EPYC host has AVX512-BF16) the emulator gave 0
# for bfloat16 subnormals. LLVM's software conversion rounds them as the GPU does.
_FLUSHING_FEATURES = ("avx512bf16", "avxneconvert", "amx-bf16")


def _host_features() -> str:
    """The host CPU's features for the JIT, without the flushing bfloat16 conversions."""
    features = llvm.get_host_cpu_features()
    for name in _FLUSHING_FEATURES:
        if name in features:
            features[name] = False
    return features.flatten()


GUARD = 256  # bytes of 0xFF on each side of every buffer Kernels.__call__ launches on


def guarded(shape: tuple, dtype: np.dtype, fill: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """An array of ``shape`` and ``dtype`` (filled with ``fill`` unless None: then 0xFF bytes)
    inside a 0xFF-filled byte array with :data:`GUARD` bytes on both sides, its data 64-byte
    aligned (so that the 16-byte paths still run), and that byte array."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = np.full(nbytes + 2 * GUARD + 64, 0xFF, np.uint8)
    off = (-raw.ctypes.data) % 64
    back = raw[off:off + nbytes + 2 * GUARD]
    arr = back[GUARD:GUARD + nbytes].view(dtype).reshape(shape)
    if fill is not None:
        arr[...] = fill
    return arr, back


class Kernels:
    """The kernels of one compiled fusion, JIT-compiled for the host."""

    def __init__(self, fusion: kp.fusion, static: dict | None = None) -> None:
        build = pipeline.run(pipeline.new_build(fusion, ["sm_80"], static, {}), stop="llvm_ir")
        self.summary = pipeline.summarize(build).summary
        self.planner = Planner(self.summary)
        _host()
        # the engine owns its target machine; host features (F16C) convert halves inline
        tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=_host_features())
        module = llvm.parse_assembly(_to_host(build.ir))
        module.verify()
        self.engine = llvm.create_mcjit_compiler(module, tm)
        self.engine.finalize_object()
        self.functions = {}
        self.params = {}
        for name in build.kernels:
            fn = module.get_function(name)
            self.params[name] = len(list(fn.arguments))
            self.functions[name] = self.engine.get_function_address(name)

    def __call__(self, *inputs: object) -> list[np.ndarray]:
        """:meth:`run` with the emulator's threaded launches."""
        return self.run(inputs, lambda launch, buffers, values, plan:
                        self._launch(launch, buffers, values))

    def run(self, inputs: tuple, launch_with: Callable[[Any, dict, dict, Any], None]
            ) -> list[np.ndarray]:
        """Plan and run every launch on copies of ``inputs``, each by ``launch_with(planned
        launch, buffers, values, plan)`` (another schedule of the threads: review 59's eager
        one); the outputs (copies). Every
        buffer lies between :data:`GUARD` bytes of 0xFF, checked after each launch: a store
        past either end of a buffer fails here (plain arrays let it land in the heap, unseen:
        review 59's F04), and a float load past the end reads NaN, which shows in the result.
        Outputs and scratch start as NaN (floats) or all ones (0xFF bytes) so that an element
        no launch writes shows too."""
        values = dict(zip((p.name for p in self.summary.inputs), inputs))
        plan = self.planner.plan(*[v.shape if isinstance(v, np.ndarray) else v for v in inputs])
        buffers, backs = {}, {}
        for name, v in values.items():
            if isinstance(v, np.ndarray):
                buffers[name], backs[name] = guarded(v.shape, v.dtype, v)
        for alloc in plan.allocations.values():
            dt = np.dtype(_NP[alloc.dtype.name])
            buffers[alloc.name], backs[alloc.name] = guarded(
                tuple(alloc.shape), dt, np.nan if dt.kind in "fc" else None)
        for launch in plan.launches:
            launch_with(launch, buffers, values, plan)
            for name, back in backs.items():
                assert (back[:GUARD] == 0xFF).all() and (back[-GUARD:] == 0xFF).all(), \
                    f"{launch.kernel} stored outside {name!r}"
        return [np.array(buffers[t.name]) for t in self.summary.outputs]

    def c_call(self, launch, buffers: dict, values: dict) -> tuple[Any, list]:
        """The planned ``launch``'s host function as a ctypes callable, and its arguments:
        the arrays of ``buffers`` and the scalars of ``values``, by name."""
        argtypes, argv = [], []
        for arg in launch.args:
            if arg[0] == "buffer":
                argtypes.append(ctypes.c_void_p)
                argv.append(buffers[arg[1]].ctypes.data)
            elif arg[0] == "scalar":
                dt = self.summary.param(arg[1]).dtype
                argtypes.append(_CT[dt.name])
                argv.append(values[arg[1]])
            else:
                argtypes.append(_CT[arg[2].name])
                argv.append(arg[1])
        return ctypes.CFUNCTYPE(None, *argtypes)(self.functions[launch.kernel]), argv

    def _launch(self, launch, buffers: dict, values: dict) -> None:
        fn, argv = self.c_call(launch, buffers, values)
        grid, block = launch.grid[0], launch.block[0]
        for ctaid in range(grid):
            barrier = threading.Barrier(block)
            warps = [_Warp() for _ in range((block + 31) // 32)]
            errors: list[BaseException] = []

            def body(tid: int) -> None:
                _state.tid, _state.ctaid, _state.ntid, _state.nctaid = tid, ctaid, block, grid
                _state.block_barrier, _state.warp = barrier, warps[tid // 32]
                try:
                    fn(*argv)
                except BaseException as exc:  # pragma: no cover - surfaced below
                    errors.append(exc)

            run_block(block, body, errors)


def run_block(block: int, body: Callable[[int], None], errors: list[BaseException]) -> None:
    """One OS thread per thread of a block, each running ``body(tid)``, joined; then the first
    exception the bodies put in ``errors``, raised here."""
    threads = [threading.Thread(target=body, args=(t,)) for t in range(block)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def run_fusion(fusion: kp.fusion, *inputs: object) -> list[np.ndarray]:
    """Compile ``fusion`` for the host emulator and run it on NumPy inputs."""
    return Kernels(fusion)(*inputs)


def assert_close(got, ref, tol: float, what: str) -> None:
    """An emulated result against its NumPy reference: same shape, NaN in the same places,
    and the largest error at most ``tol`` relative to the reference's largest magnitude."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, what
    if ref.size == 0:
        return
    assert np.array_equal(np.isnan(got), np.isnan(ref)), f"{what}: NaN positions differ"
    keep = ~np.isnan(ref)
    if not keep.any():
        return
    # in float64 (or complex128): a float32 reference's 1e-300 floor underflowed to 0, so an
    # all-zero reference gave 0/0 = NaN; a zero reference compares the absolute error
    wide = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(ref) else np.float64
    diff = np.abs(got[keep].astype(wide) - ref[keep].astype(wide))
    scale = float(np.max(np.abs(ref[keep].astype(wide))))
    err = float(np.max(diff)) / (scale if scale > 0 else 1.0)
    assert err <= tol, f"{what}: {'relative' if scale > 0 else 'absolute'} error {err:.2e}"
