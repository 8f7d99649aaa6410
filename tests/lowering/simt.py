"""A tiny SIMT emulator: run the lowering's kernels on the CPU, so CI (no GPU) checks numerics.

The kernels' LLVM IR (before PTX) is retargeted to the host: special registers, warp shuffles
and barriers become calls to helpers, shared memory a plain global, libdevice functions the
host's libm. Every GPU thread of a block that waits for others (``bar.sync``, a shuffle) runs as
an OS thread of its own (ctypes releases the GIL while JIT-compiled code runs), so shuffles and
barriers have their real cooperative semantics; a kernel with neither runs its threads one
after another. Only small launches are practical; that is all tests need.

Two sets of helpers. :meth:`Kernels.__call__` uses native ones (:data:`_NATIVE_IR`, JIT-compiled
once): each thread's registers come from ``pthread_getspecific``, barriers are POSIX barriers,
so no emulated thread takes the GIL until its kernel returns. :meth:`Kernels.c_call` gives the
kernels built with Python callbacks instead (registers from :data:`_state`, barriers any
object with ``wait()``), for schedules written in Python (tests/lowering/test_review48_in_place.py).
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


_libc = ctypes.CDLL(None)
_KEY = ctypes.c_uint()  # the pthread key of each OS thread's _Registers
if _libc.pthread_key_create(ctypes.byref(_KEY), None) != 0:
    raise OSError("simt: pthread_key_create failed")
_set_specific = _libc.pthread_setspecific
_set_specific.argtypes = [ctypes.c_uint, ctypes.c_void_p]
_barrier_init = _libc.pthread_barrier_init
_barrier_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
_barrier_wait = _libc.pthread_barrier_wait  # (ctypes releases the GIL while it waits)
_barrier_wait.argtypes = [ctypes.c_void_p]
_barrier_destroy = _libc.pthread_barrier_destroy
_barrier_destroy.argtypes = [ctypes.c_void_p]
_BARRIER_BYTES = 128  # sizeof(pthread_barrier_t) is 32 on glibc's x86-64 and arm64: room


class _Registers(ctypes.Structure):
    """One emulated thread's view, read by the native helpers (:data:`_NATIVE_IR`'s
    ``%regs``, field for field)."""
    _fields_ = [("tid", ctypes.c_int32), ("ctaid", ctypes.c_int32), ("ntid", ctypes.c_int32),
                ("nctaid", ctypes.c_int32), ("block_barrier", ctypes.c_void_p),
                ("warp_barrier", ctypes.c_void_p), ("warp_values", ctypes.c_void_p)]


# The native helpers: the calling thread's _Registers from pthread_getspecific(KEY); a
# shuffle writes its lane's value to the warp's slots, waits for the warp, reads its partner's,
# and waits again before the slots are reused (as _shfl does in Python).
_SREGS = ("tid", "ctaid", "ntid", "nctaid")  # the special registers the kernels read (.x)
_NATIVE_IR = """
%regs = type { i32, i32, i32, i32, ptr, ptr, ptr }
declare ptr @kp_getspecific(i32)
declare i32 @kp_barrier_wait(ptr)

define internal i32 @field(i32 %i) {
  %r = call ptr @kp_getspecific(i32 KEY)
  %p = getelementptr i32, ptr %r, i32 %i
  %v = load i32, ptr %p
  ret i32 %v
}
define void @kp_native_barrier() {
  %r = call ptr @kp_getspecific(i32 KEY)
  %p = getelementptr %regs, ptr %r, i32 0, i32 4
  %b = load ptr, ptr %p
  %w = call i32 @kp_barrier_wait(ptr %b)
  ret void
}
define i32 @kp_native_shfl(i32 %mask, i32 %value, i32 %lanemask, i32 %clamp) {
  %r = call ptr @kp_getspecific(i32 KEY)
  %tid = call i32 @field(i32 0)
  %lane = and i32 %tid, 31
  %bp = getelementptr %regs, ptr %r, i32 0, i32 5
  %b = load ptr, ptr %bp
  %vp = getelementptr %regs, ptr %r, i32 0, i32 6
  %values = load ptr, ptr %vp
  %mine = getelementptr i32, ptr %values, i32 %lane
  store i32 %value, ptr %mine
  %w1 = call i32 @kp_barrier_wait(ptr %b)
  %src = xor i32 %lane, %lanemask
  %theirs = getelementptr i32, ptr %values, i32 %src
  %other = load i32, ptr %theirs
  %w2 = call i32 @kp_barrier_wait(ptr %b)
  ret i32 %other
}
""" + "".join(f"""
define i32 @kp_native_{reg}() {{
  %v = call i32 @field(i32 {i})
  ret i32 %v
}}""" for i, reg in enumerate(_SREGS))  # _Registers' first fields, in order
_NATIVE = _SREGS + ("barrier", "shfl")


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
    for name, fn in (("kp_getspecific", _libc.pthread_getspecific),
                     ("kp_barrier_wait", _libc.pthread_barrier_wait)):
        llvm.add_symbol(name, ctypes.cast(fn, ctypes.c_void_p).value)
    module = llvm.parse_assembly(_NATIVE_IR.replace("KEY", str(_KEY.value)))
    module.verify()
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple()
                                        .create_target_machine(opt=2))
    engine.finalize_object()
    for name in _NATIVE:
        llvm.add_symbol(f"kp_native_{name}", engine.get_function_address(f"kp_native_{name}"))
    # x86 code generation calls libgcc's helpers for what the CPU lacks (half conversions,
    # 128-bit division); the JIT finds them only in libraries loaded with global symbols and
    # otherwise links address 0 without a word: the process dies when the kernel runs
    gcc_s = ctypes.util.find_library("gcc_s")
    if gcc_s:
        llvm.load_library_permanently(gcc_s)
    return engine  # kept for the process: its code is the helpers


def _helper_prefix(native: bool) -> str:
    """The prefix of the helpers' names in the host IR: the native ones or the callbacks."""
    return "kp_native_" if native else "kp_"


def _to_host(ir_text: str, native: bool) -> str:
    """The kernels' IR for the host JIT, with the native helpers (``kp_native_*``) or the
    Python callbacks (``kp_*``) in place of special registers, shuffles and barriers."""
    kp_ = _helper_prefix(native)
    text = re.sub(r'target (triple|datalayout) = "[^"]*"\n', "", ir_text)
    for reg in _SREGS:
        text = text.replace(f'"llvm.nvvm.read.ptx.sreg.{reg}.x"', f'"{kp_}{reg}"')
    text = text.replace('"llvm.nvvm.shfl.sync.bfly.i32"', f'"{kp_}shfl"')
    text = text.replace('"llvm.nvvm.barrier0"', f'"{kp_}barrier"')
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


class _Jit:
    """The kernels' IR JIT-compiled for the host with one set of helpers (:func:`_to_host`):
    each kernel's address, and whether it waits for other threads (a barrier or a shuffle)."""

    def __init__(self, ir: str, kernels: tuple[str, ...], native: bool) -> None:
        # the engine owns its target machine; host features (F16C) convert halves inline
        tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=_host_features())
        text = _to_host(ir, native)
        module = llvm.parse_assembly(text)
        module.verify()
        self.engine = llvm.create_mcjit_compiler(module, tm)
        self.engine.finalize_object()
        self.functions = {name: self.engine.get_function_address(name) for name in kernels}
        waits = re.compile(f'@"{_helper_prefix(native)}(barrier|shfl)"')
        bodies = _bodies(text)  # (a kernel not found there runs its threads at once: always right)
        self.cooperative = {name: name not in bodies or waits.search(bodies[name]) is not None
                            for name in kernels}


def _bodies(text: str) -> dict[str, str]:
    """Each function defined in the IR ``text``: its name and text (the lowering emits no
    functions but its kernels, so a kernel's calls are all in its own body)."""
    found = {}
    for part in text.split("\ndefine ")[1:]:
        name = re.search(r'@"?([^"(]+)"?\(', part)
        if name is not None:
            found[name.group(1)] = part[:part.find("\n}")]
    return found


class _Block:
    """What a launch's threads share (the helpers' view: :class:`_Registers`): the block's
    barrier, one barrier and 32 shuffle slots per warp (a warp's barrier counts its threads:
    32, fewer in a last partial warp), and each thread's registers."""

    def __init__(self, block: int, grid: int) -> None:
        nwarps = (block + 31) // 32
        self.memory = ctypes.create_string_buffer(_BARRIER_BYTES * (1 + nwarps) + 128 * nwarps)
        base = ctypes.addressof(self.memory)
        self.barriers = [base + _BARRIER_BYTES * i for i in range(1 + nwarps)]
        values = base + _BARRIER_BYTES * (1 + nwarps)
        for i, at in enumerate(self.barriers):
            count = block if i == 0 else min(32, block - 32 * (i - 1))
            if _barrier_init(at, None, count) != 0:
                raise OSError(f"simt: pthread_barrier_init({count}) failed")
        self.registers = [_Registers(tid, 0, block, grid, self.barriers[0],
                                     self.barriers[1 + tid // 32], values + 128 * (tid // 32))
                          for tid in range(block)]

    def close(self) -> None:
        for at in self.barriers:
            _barrier_destroy(at)


class Kernels:
    """The kernels of one compiled fusion, JIT-compiled for the host."""

    def __init__(self, fusion: kp.fusion, static: dict | None = None) -> None:
        build = pipeline.run(pipeline.new_build(fusion, ["sm_80"], static, {}), stop="llvm_ir")
        self.summary = pipeline.summarize(build).summary
        self.planner = Planner(self.summary)
        _host()
        self._ir, self._kernels = build.ir, tuple(build.kernels)
        self._native = _Jit(self._ir, self._kernels, native=True)
        self._python: _Jit | None = None  # built by the first c_call

    @property
    def functions(self) -> dict[str, int]:
        """Each kernel's address in the native build, by name: what :meth:`__call__`
        launches (a test may point one name at another kernel of the same launch shape)."""
        return self._native.functions

    def __call__(self, *inputs: object) -> list[np.ndarray]:
        """:meth:`run` with the emulator's launches (:meth:`_launch`)."""
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
        """The planned ``launch``'s host function built with the Python callbacks (its
        registers from :data:`_state`, barriers and warps as :func:`_launch_in_python` sets
        them) as a ctypes callable, and its arguments: the arrays of ``buffers`` and the
        scalars of ``values``, by name. For schedules written in Python."""
        if self._python is None:
            self._python = _Jit(self._ir, self._kernels, native=False)
        return self._callable(self._python, launch, buffers, values)

    def _callable(self, jit: _Jit, launch, buffers: dict, values: dict) -> tuple[Any, list]:
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
        return ctypes.CFUNCTYPE(None, *argtypes)(jit.functions[launch.kernel]), argv

    def _launch(self, launch, buffers: dict, values: dict) -> None:
        """One launch with the native helpers: a kernel that waits for other threads runs
        each block's threads at once, one OS thread each, block after block (the threads
        wait at the block's barrier between blocks: shared memory is one global); any
        other kernel runs its threads one after another on this thread."""
        fn, argv = self._callable(self._native, launch, buffers, values)
        grid, block = launch.grid[0], launch.block[0]
        shared = _Block(block, grid)
        try:
            if not self._native.cooperative[launch.kernel]:
                for ctaid in range(grid):
                    for regs in shared.registers:
                        regs.ctaid = ctaid
                        _set_specific(_KEY.value, ctypes.addressof(regs))
                        fn(*argv)
                return
            errors: list[BaseException] = []

            def body(tid: int) -> None:
                regs, failed = shared.registers[tid], False
                _set_specific(_KEY.value, ctypes.addressof(regs))
                for ctaid in range(grid):
                    regs.ctaid = ctaid
                    if not failed:
                        try:
                            fn(*argv)
                        except BaseException as exc:  # pragma: no cover - surfaced below
                            errors.append(exc)
                            failed = True  # (still at the barriers: the others wait there)
                    _barrier_wait(shared.barriers[0])

            run_block(block, body, errors)
        finally:
            _set_specific(_KEY.value, None)
            shared.close()

    def _launch_in_python(self, launch, buffers: dict, values: dict) -> None:
        """One launch with the Python callbacks (:meth:`c_call`), each block's threads at
        once: the reference the native helpers replaced, and what schedules written in
        Python set up the same way (:data:`_state`'s ``block_barrier`` and ``warp``)."""
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
    exception the bodies put in ``errors``, raised here. (A pool of threads kept between
    launches saved only ~10% once kernels ran without Python, and left hundreds of idle
    threads in the process of the tests that follow.)"""
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
