"""Review 58: mutation testing of the C fast call (``runtime/_fastcall.c`` beyond review 55's
``conflicts``/``written_conflict``/``pairs_from``/overlap checks) and of the owned descriptor
(``_fdowner.c``).

Method: a throw-away runner outside the repo, on copies of the tree (src, tests, ...) run with
PYTHONPATH set to them, changed one site at a time; each mutant rebuilt the extension with gcc
(the sources and flags of setup.py for 3.11: ``-DPy_LIMITED_API=0x030B0000``, the venv
Python's include dir; ``kernelpack.runtime._launch`` checked to load from the copy), ran its
tests with ``-x``, and restored the source and rebuilt the original object before the next
(a first pass linked the fd mutants of a verification run with the last _fastcall.c mutant's
object; those were run again). _fastcall.c mutants ran the C fast path's CPU tests
(test_fastpath_fake, test_fast_native, test_fast_scratch, test_fast_exchange,
test_fast_context, test_review11_fastcall_*, test_review9_fast_keys,
test_review9_outputs_fast, test_review4_fastpath, test_review55_copy_mutants,
test_in_place_refused, test_lazy_views), then this file, then 22 more runtime files that reach
the C path (test_inout_overlap, test_review11_multidevice, test_review11_warmup_fast,
test_review22_scratch, test_review43_runtime_read, test_review9_outputs,
test_review9_zero_size, test_launch_fake, test_review10_*, test_review8_dlpack_producers,
test_review_lifecycle, test_review_runtime, test_review9/6/3_arguments, test_review4_values,
test_review4_inout, test_aliasing, test_in_place); a mutant killed only by this file was run
on those 22 afterwards, so "[here]" below means no suite file kills it. _fdowner.c mutants ran
test_review39_fdowner (its fast tests, then all of it) and test_images.

Most of the C path is reachable on CPU: the tests below drive ``_launch.FastCall`` directly
(as test_review11_fastcall_* do) with stand-ins for a torch tensor, a cupy array (flavor
'cupy': ``_c_contiguous``, ``data.ptr``/``data.device_id``, NumPy-style dtype equality,
the alignment check), DLPack's C exchange API (dlpack_exchange.FakeExchange, extended here
with explicit strides, byte offsets, device types, ranks, dtype codes and lanes) and a ctypes
``cuLaunchKernel`` bound with ``_launch.bind`` that records the seven dimensions, the stream
and every parameter's bytes.

255 mutants built (235 in _fastcall.c, 20 in _fdowner.c; 2 more did not compile): 151 killed by
the suite, 94 killed by the tests here, 10 equivalent, 0 not reachable on CPU. Per function,
each mutant's id, what it changed and what kills it: [here] this file (the test naming it in
its docstring), [eq] equivalent (below), else the suite file that failed first (test_ and .py
left off; [crash]: the test process crashed).

- read_array: RA1 exact-type check dropped [fastpath_fake]; RA2 dtype identity miss returns
  (no equality compare) [here]; RA3 dtype not checked [fastpath_fake]; RA4 cupy's second
  dtype read error handed on as 0 [here]; RA5 equality branch taken for torch, not cupy
  [fastpath_fake]; RA6 unequal cupy dtype accepted [fastpath_fake]; RA7 is_contiguous()
  error not cleared [fastpath_fake]; RA8 non-contiguous accepted [fast_context]; RA9 cupy
  alignment unchecked [here]; RA10 alignment: lowest bit only [here]; RA11 get_device() not
  an int: read on [here]; RA12 data_ptr() error not cleared [review11_fastcall_threads];
  RA13 data_ptr() not an int: read on [review11_fastcall_values]; RA14 shape never read
  [crash]; RA15 cupy memory read error returned as 0 [here].
- device_of: DV1 device overflow ignored [here]; DV2 device not an int raises
  [review11_fastcall_values]; DV3 device not an int read as -1 [here].
- pointer_of: PT1 pointer not an int read as 2**64-1 [review11_fastcall_values]; PT2 pointer
  error left set [review11_fastcall_values].
- is_object: IO1 is_object inverted [fastpath_fake].
- lazy_view: LV1 is_neg not asked [lazy_views]; LV2 is_conj not asked [lazy_views]; LV3
  is_neg asked twice [lazy_views].
- contiguous: CG1 contiguity: anything but False [fastpath_fake].
- cupy_memory: CM1 data.ptr error ignored [here]; CM2 data.device_id error ignored [here];
  CM3 device read only for outputs [fastpath_fake]; CM4 cupy device read as 0 [here].
- dl_contiguous: DC1 strides NULL not contiguous [fastpath_fake]; DC2 empty tensors judged
  by strides [here]; DC3 size-1 dims' strides checked [here]; DC4 dim 0 stride unchecked
  [fastpath_fake]; DC5 expected stride not multiplied [here]; DC6 wrong stride accepted
  [fastpath_fake]; DC7 expected stride starts at 0 [here].
- read_dl: DL1 exact-type check dropped [fastpath_fake]; DL2 describe failure is an error
  [fastpath_fake]; DL3 dtype code unchecked [fastpath_fake]; DL4 dtype bits unchecked
  [here]; DL5 lanes unchecked [here]; DL6 negative rank read [here]; DL7 rank 17 read
  [here]; DL8 contiguity unchecked [fastpath_fake]; DL9 device id read as 0 [fastpath_fake];
  DL10 unknown device type read [here]; DL11 byte_offset dropped [here]; DL12 host memory
  read as device 0 [here].
- dl_shape_is: SH1 out= rank not compared [here]; SH2 out= dims not compared
  [fastpath_fake]; SH3 out= last dim not compared [fastpath_fake]; SH4 entry dim conversion
  error ignored [here].
- output_pointer: OP1 output byte_offset dropped [here]; OP2 exchange API asked for another
  type [crash]; OP3 output pointer cases swapped [fastpath_fake]; OP4 cupy output pointer
  error ignored [here].
- was_pushed: WPU1 any positive answer pushed [here].
- write_param: WP1 q/Q: 4 bytes [crash]; WP2 Q: not written [crash]; WP3 i: 2 bytes
  [fast_native]; WP4 I: 2 bytes [fast_native]; WP5 h: 1 byte [fast_native]; WP6 H: 1 byte
  [fast_native]; WP7 b: value shifted [fast_native]; WP8 B: not written [fast_native]; WP9
  f: from the int member [fastpath_fake]; WP10 d: 4 bytes [fast_native]; WP11 d: as float32
  [fast_native]; WP12 (duplicate case: does not compile) [no build]; WP13 (duplicate case:
  does not compile) [no build].
- slot_values: SV1 pair length not checked [crash]; SV2 total's conversion error unchecked
  [here]; SV3 negative slot [here]; SV4 slot == n_values [here]; SV5 item length unchecked
  [fast_scratch]; SV6 last item not read [crash]; SV7 value conversion error unchecked
  [review22_scratch]; SV8 slot 0 for every item [crash]; SV9 value read from the slot
  [fast_scratch].
- scratch_from: SF1 offset == size refused [fast_scratch]; SF2 offset past size accepted
  [fast_scratch]; SF3 last offset unchecked [fast_scratch].
- entry_from: EF1 8-tuples refused [fastpath_fake]; EF2 9-tuples accepted [here]; EF3 views
  longer than n_in [here]; EF4 shapes length unchecked [here]; EF5 likes longer accepted
  [here]; EF6 65 launches [review11_fastcall_values]; EF7 view_out truth error unchecked
  [eq]; EF8 negative view [crash]; EF9 view == n_in [crash]; EF10 like == n_in [crash]; EF11
  launch index -1 [here]; EF12 launch index == n_layouts [here]; EF13 shared memory not read
  [here]; EF14 dimension 2**32 [here]; EF15 longer template [here]; EF16 last launch dropped
  [fast_native]; EF17 template's last byte lost [fast_scratch]; EF18 view_out never set
  [lazy_views]; EF19 view conversion error unchecked [here]; EF20 scratch not read [crash];
  EF21 written pairs not read [in_place_refused]; EF22 last like not read [fast_context];
  EF23 block x/y swapped [review43_runtime_read].
- entry_for: EN1 lookup error ignored [here]; EN2 cache never emptied
  [review11_fastcall_reentry]; EN3 emptied a key late [review11_fastcall_reentry]; EN4
  entries not stored [fastpath_fake]; EN5 refused keys not stored [fast_native]; EN6 cached
  capsule not INCREF'd [crash].
- remembered_entry: RE1 length not compared [eq]; RE2 last word not compared [fast_scratch];
  RE3 last key not copied [here]; RE4 last length not stored [eq]; RE5 refused key
  remembered as last [eq]; RE6 half the bytes compared [fast_scratch]; RE7 half the key
  copied [review43_runtime_read]; RE8 old last entry not released [here].
- key_of_words: KW1 a symbol read as a rank [review43_runtime_read]; KW2 symbols all the
  first [here]; KW3 dims skipped [crash]; KW4 dims past the second shifted [here].
- read_arguments: AR1 rank word dropped [fastpath_fake]; AR2 first dim dropped
  [fastpath_fake]; AR3 device mismatch ignored [fastpath_fake]; AR4 device from the second
  tensor [fastpath_fake]; AR5 float64 checked as float32 [here]; AR6 inf refused [here]; AR7
  float32 overflow unchecked [fast_native]; AR8 float subclasses read
  [review11_fastcall_reentry]; AR9 int subclasses read [here]; AR10 int upper bound dropped
  [fast_native]; AR11 int lower bound dropped [fast_native]; AR12 overflow flag ignored
  [review43_runtime_read]; AR13 lower bound exclusive [fast_native]; AR14 upper bound
  exclusive [fast_native]; AR15 non-symbol ints in the key [fast_native]; AR16 floats
  rounded to float32 [here]; AR17 int conversion error unchecked [eq]; AR18 every dim the
  first [fast_context].
- allocate_outputs: AO1 like 0 ignored [fast_scratch]; AO2 likes ignored [fast_scratch]; AO3
  cupy: first output's dtype [here]; AO4 allocate: first output's dtype [here]; AO5 pointers
  into the first slot [fast_native]; AO6 cupy: first output's shape [here]; AO7 allocate:
  first output's shape [review22_scratch]; AO8 outputs leaked on failure [here]; AO9
  allocate: no device [fast_context]; AO10 one output as a tuple [fastpath_fake].
- allocate_scratch: AS1 empty scratch allocated [review22_scratch]; AS2 null base not kept
  null [eq]; AS3 offsets dropped [fast_scratch]; AS4 scratch: no device [here]; AS5 first
  buffer not written [fast_scratch].
- check_out: CO1 one out= for several outputs [review43_runtime_read]; CO2 dl out= shape
  unchecked [fastpath_fake]; CO3 out= shape >= accepted [fastpath_fake]; CO4 out= device
  unchecked [review11_fastcall_values]; CO5 out= lazy view unchecked [lazy_views]; CO6 out=
  pointer not written [fastpath_fake]; CO7 out= lazy-view error handed on [here]; CO8 out=
  DLPack dtype of tensor 0 [here]; CO9 out= alignment unchecked [here]; CO10 out= refusal
  read as fit [fastpath_fake].
- stream_of: SO1 device 0 not through the API [fast_exchange]; SO2 stream of device 0 asked
  [here]; SO3 stream_handle without device [here]; SO4 handle error ignored [here]; SO5 API
  stream read as 0 [fast_exchange]; SO6 raw_stream not asked [here]; SO7 cupy stream read as
  0 [fastpath_fake]; SO8 stream= ignored on the API path [fastpath_fake].
- launch_all: LA1 handle 2 not default [here]; LA2 handle 3 default [here]; LA3 remembered
  device not compared [here]; LA4 epoch not compared [fast_context]; LA5 untrusted
  remembered [fast_context]; LA6 pushed remembered [here]; LA7 no pop [fast_context]; LA8
  launches after a failure [here]; LA9 every launch the first function [fast_native]; LA10
  failures not recovered/raised [fast_context]; LA11 pushed never seen [fast_context]; LA12
  function list error ignored [here]; LA13 device not remembered [fast_context].
- launch_one: LO1 template not copied [fastpath_fake]; LO2 first dynamic param skipped
  [fastpath_fake]; LO3 value slot by position [fast_native]; LO4 every param at offset 0
  [crash]; LO5 params non-NULL when none [eq]; LO6 block x from by [review43_runtime_read];
  LO7 shared memory 0 [here]; LO8 stream NULL [fastpath_fake]; LO9 grid y/z swapped [here].
- recover: RC1 explicit stream recovered [here]; RC2 device not compared [here]; RC3 failed
  context still remembered [here]; RC4 pushed retry not popped [here]; RC5 untrusted
  recovery remembered [here]; RC6 retry failure ignored [here]; RC7 error code 1 [here]; RC8
  launch index 0 [here]; RC9 dims all grid x [here]; RC10 launch_failed never called
  [fast_context]; RC11 pushed never seen [here]; RC12 retried when unchanged [fast_context];
  RC13 recovered context not remembered [here].
- pop_context: PC1 error not restored [here]; PC2 pop error left set [here]; PC3 error not
  fetched [here].
- fastcall_run: FR1 stream= with allocated outputs fast [here]; FR2 extra arguments accepted
  [here]; FR3 cupy current device unchecked [fastpath_fake]; FR4 scratch with stream= fast
  [fast_scratch] (since session 42 the fast path's, with that stream's scratch); FR5 lazy
  views asked for cupy too [crash]; FR6 first view unchecked
  [lazy_views]; FR7 lazy views accepted [lazy_views]; FR8 out= refusal ignored
  [fastpath_fake]; FR9 fast_calls not counted [fastpath_fake]; FR10 scratch leaked
  [fast_scratch]; FR11 states lookup error ignored [here]; FR12 written pairs unchecked
  [in_place_refused]; FR13 fast_calls miscounted with outputs [fastpath_fake]; FR14 stream
  error ignored [here]; FR15 launch error ignored [fast_context]; FR16 cupy device never
  asked [fastpath_fake].
- fastcall_call: FC1 nesting unbounded [crash]; FC2 nesting never decremented
  [fastpath_fake]; FC3 nesting limit 1 [fastpath_fake].
- forget_contexts: FE1 forget_contexts a no-op [fast_context].
- functions_of: FO1 handles re-read every call [eq]; FO2 every launch function 0
  [fast_native]; FO3 handle by launch position [crash]; FO4 state not recorded
  [review11_fastcall_reentry]; FO5 longer function list accepted [here].
- _fdowner.c: FD1 release never closes [review39_fdowner]; FD2 release skips fd 0 [here];
  FD3 fileno refuses 0 [here]; FD4 close() keeps the number [images]; FD5 close() closes
  nothing [review39_fdowner]; FD6 negative accepted [review39_fdowner]; FD7 beyond INT_MAX
  accepted [review39_fdowner]; FD8 not close-on-exec [review39_fdowner]; FD9 field 0 before
  the dup [images]; FD10 dup not stored [review39_fdowner]; FD11 conversion error unchecked
  [review39_fdowner]; FD12 __reduce_ex__ removed [eq]; FD13 __reduce__ removed [eq]; FD14
  instantiation allowed [review39_fdowner]; FD15 type reference kept [here]; FD16 dup
  failure unchecked [review39_fdowner]; FD17 failed owner leaked [here]; FD18 fileno off by
  one [review39_fdowner]; FD19 dup kept above 2 [here]; FD20 release skips fd 0 (after
  clearing) [here].

Equivalent survivors (behaviour unchanged; at most speed):
- EF7: view_out's truth error unchecked: it stays set, and the next conversion's
  ``PyErr_Occurred()`` (slot_values, on the overlap total) reports it: the same exception,
  nothing cached.
- RE1: the words' length not compared: a key's words parse themselves (per tensor its rank,
  then that many dims; then a fixed count of symbols), so no key of another length can equal
  the first words of the last one.
- RE4: the last key's length never stored: the remembered entry is never used and every call
  takes the dict (the Python key is built each time).
- RE5: a refused key (None) remembered as the last: its next identical call answers None, as
  the dict does.
- AR17: ``PyLong_AsLongLongAndOverflow`` on an exact int never raises.
- AS2: the base pointer is null only for an empty scratch, whose offsets are all 0.
- LO5: a non-NULL ``kernelParams`` for a kernel without parameters: the driver reads none.
- FO1: the function handles re-read on every call: the same handles; the replaced state is
  still released.
- FD12, FD13: either refusal alone still refuses pickling and copying at every protocol
  (``object.__reduce_ex__`` calls an overriding ``__reduce__``; ``__reduce_ex__`` alone
  refuses every protocol).
Not built: WP12, WP13 (a case label changed into a duplicate one).

Not reachable on CPU: none of these mutants. Every mutated line ran through the stand-ins;
the branches only a failed allocation reaches (``PyErr_NoMemory``) were not mutated, and what
a real torch/cupy/driver answers beyond the stand-ins (torch's own DLPack descriptions, CuPy's
memory pool, real context loss) is the GPU tests' (tests/runtime/test_gpu_*.py).

Real bugs: none found. Observation (not a user-facing bug, so no xfail): ``entry_from`` read
a launch's layout index with ``(int)PyLong_AsLong``, so an index of 2**32 from hooks.entry was
taken for launch 0 instead of being refused as out of range; fast_native.py only answers
indices it enumerated, so no call reached it. Session 41 compares the ``long`` before the
cast, and test_a_malformed_entry_answer_is_an_error has that case.

Run: ``.venv/bin/python -m pytest -q -p no:cacheprovider
tests/runtime/test_review58_fastcall_mutants.py`` (about 1 s).
"""

from __future__ import annotations

import ctypes
import gc
import struct
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

_launch = pytest.importorskip("kernelpack.runtime._launch",
                              reason="the C extension kernelpack.runtime._launch is not built")

sys.path.insert(0, str(Path(__file__).parent))
from dlpack_exchange import DL, POINTER, DLDataType, DLDevice, FakeExchange, c_int64

FUNCS = (0x5150, 0x6160, 0x7170)  # function handles of launch 0, 1, 2


# ---- stand-ins -------------------------------------------------------------------------------
class Dtype:
    """A torch-like dtype (compared by identity); ``itemsize`` gives the C type's alignment
    check (cupy arrays)."""

    def __init__(self, name: str, itemsize: int) -> None:
        self.name, self.itemsize = name, itemsize

    def __repr__(self) -> str:
        return f"dtype.{self.name}"


F32, I32, F64 = Dtype("float32", 4), Dtype("int32", 4), Dtype("float64", 8)


class T:
    """A torch-like tensor over host memory (every read is a plain attribute or method)."""

    def __init__(self, shape: tuple = (2,), dtype: Dtype = F32, device: Any = 0,
                 contiguous: bool = True, conj: bool = False, neg: bool = False,
                 ptr: Any = None, strides: tuple | None = None, byte_offset: int = 0) -> None:
        n = 1
        for d in shape:
            n *= d
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        self.buf = ctypes.create_string_buffer(8 * max(n, 1) + 64)
        self.contiguous, self.conj, self.neg = contiguous, conj, neg
        self.ptr = ptr
        self.dl_strides, self.dl_offset = strides, byte_offset  # what the exchange API says

    def data_ptr(self) -> Any:
        return ctypes.addressof(self.buf) if self.ptr is None else self.ptr

    def get_device(self) -> Any:
        return self.device

    def is_contiguous(self) -> bool:
        return self.contiguous

    def is_conj(self) -> bool:
        return self.conj

    def is_neg(self) -> bool:
        return self.neg


class Mem:
    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr, self.device_id = ptr, device_id


class A:
    """A cupy-like array: ``cupy.ndarray(shape, dtype)`` allocates; ``_c_contiguous`` and
    ``data`` (ptr, device_id) are what the C path reads."""

    def __init__(self, shape: tuple = (2,), dtype: Any = F32, device: int = 0,
                 offset: int = 0) -> None:
        n = 1
        for d in shape:
            n *= d
        self.shape, self.dtype = tuple(shape), dtype
        self.buf = ctypes.create_string_buffer(8 * max(n, 1) + 64)
        self._c_contiguous = True
        self.data = Mem(ctypes.addressof(self.buf) + offset, device)


_PROTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7),
                          ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class Driver:
    """cuLaunchKernel as the C fast path calls it: each launch's (function, the seven
    dimensions, stream, the parameters' bytes (sizes ``sizes``), or None for a NULL array).
    ``errors``: CUresults the next launches answer (then 0)."""

    def __init__(self) -> None:
        self.launches: list[tuple] = []
        self.sizes: tuple = (8, 8, 4)
        self.errors: list[int] = []
        self.entry = _PROTO(self._launch)
        _launch.bind(ctypes.cast(self.entry, ctypes.c_void_p).value)

    def _launch(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> int:
        got = None if not params else tuple(ctypes.string_at(params[k], n)
                                            for k, n in enumerate(self.sizes))
        self.launches.append((f, (gx, gy, gz, bx, by, bz, smem), stream or 0, got))
        return self.errors.pop(0) if self.errors else 0

    def pointers(self, k: int = -1) -> tuple:
        """The two pointers of launch k (x, z)."""
        got = self.launches[k][3]
        return struct.unpack("<Q", got[0])[0], struct.unpack("<Q", got[1])[0]


_drivers: list[Driver] = []  # bound callbacks stay alive: a later test may launch


@pytest.fixture
def driver() -> Driver:
    d = Driver()
    _drivers.append(d)
    _launch.forget_contexts()
    return d


class State:
    def __init__(self, n: int = 1) -> None:
        self.flat = list(FUNCS[:n])


class Failed(Exception):
    pass


class Hooks:
    """fast_native.Hooks' protocol; ``answer(key)`` is hooks.entry's answer (default: one
    launch, z shaped and allocated like x)."""

    def __init__(self, answer: Callable[[tuple], Any] | None = None) -> None:
        self.answer = answer or default_answer
        self.keys: list = []
        self.slow_calls: list = []
        self.allocated: list = []
        self.scratches: list = []
        self.lost: list = []
        self.popped: list = []
        self.streams: list = []
        self.failed: list = []
        self.context = False  # context_was_lost's answer

    def entry(self, key):
        self.keys.append(key)
        return self.answer(key)

    def slow(self, args, out, stream):
        self.slow_calls.append((args, out, stream))
        return "slow"

    def allocate(self, shape, dtype, device, stream=None):
        self.allocated.append((shape, dtype, device) if stream is None
                              else (shape, dtype, device, stream))
        return T(shape, dtype, device)

    def scratch(self, nbytes, device):
        self.scratches.append((nbytes, device))
        t = T((nbytes,), F32, device)
        self.scratch_base = t.data_ptr()
        return t

    def context_was_lost(self, st):
        self.lost.append(st)
        return self.context() if callable(self.context) else self.context

    def pop_context(self, st):
        self.popped.append(st)

    def stream_handle(self, stream, device):
        self.streams.append((stream, device))
        return int(stream)

    def launch_failed(self, *args):
        self.failed.append(args)
        raise Failed(args)


def block(*values: tuple) -> bytes:
    """A parameter block template: (code, value) pairs packed little-endian, no padding."""
    return b"".join(struct.pack("<" + c, v) for c, v in values)


def launch(n: int, j: int = 0, dims: tuple = (1, 1, 1, 1, 1, 0),
           tmpl: bytes | None = None) -> tuple:
    """An entry's launch: grid x n, then gy gz bx by bz and shared memory from ``dims``."""
    return (j, n, *dims, bytes(24) if tmpl is None else tmpl)


def default_answer(key) -> tuple:
    (n,), *_ = key
    return (((n,),), (0,), (launch(n),), (), False, (0, ()), None)


LAYOUT = ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "f", 2))),)


def make(hooks: Hooks, *, tensor_type: type = T, n_in: int = 2,
         tensors: tuple = ((0, 0, F32),), floats: tuple = ((1, 2),), ints: tuple = (),
         outs: tuple = ((1, F32),), nvalues: int = 3, layouts: tuple = LAYOUT,
         trust: bool = True, flavor: str = "torch", current_device: Any = None,
         dlpack: Any = None, scratch: Any = None, empty_like: Any = None,
         raw_stream: Any = None, states: dict | None = None) -> Any:
    """A FastCall (default: f(x: f32[n], a: float) -> z like x, one launch of block
    (x, z, a))."""
    if empty_like is None:
        empty_like = (lambda t: T(t.shape, t.dtype, t.device)) if flavor == "torch" else None
    if raw_stream is None:
        raw_stream = (lambda d: 0) if flavor == "torch" else (
            lambda: types.SimpleNamespace(ptr=0))
    return _launch.FastCall(tensor_type, empty_like, raw_stream, hooks,
                            {0: State(len(layouts))} if states is None else states, n_in,
                            tensors, floats, ints, outs, nvalues, layouts, trust, flavor,
                            current_device, dlpack, scratch)


class Exchange(FakeExchange):
    """The stand-in exchange API over ``T``: a tensor's ``dl_strides`` / ``dl_offset`` /
    ``dl_device`` (device type) / ``dl_ndim`` / ``dl_lanes`` / ``dl_dtype`` say what its
    DLTensor holds beyond the plain reads."""

    def _describe(self, obj_address: int, out: Any) -> int:
        t = ctypes.cast(obj_address, ctypes.py_object).value
        self.described.append(t)
        ndim = getattr(t, "dl_ndim", len(t.shape))
        shape = (c_int64 * max(len(t.shape), 1))(*t.shape)
        strides = None
        if t.dl_strides is not None:
            strides = (c_int64 * max(len(t.shape), 1))(*t.dl_strides)
        self._keep += [shape, strides]
        out[0].data = t.data_ptr()
        dev = t.get_device()
        out[0].device = DLDevice(getattr(t, "dl_device", 2 if dev >= 0 else 1), max(dev, 0))
        out[0].ndim = ndim
        code, bits = getattr(t, "dl_dtype", DL[t.dtype.name])
        out[0].dtype = DLDataType(code, bits, getattr(t, "dl_lanes", 1))
        out[0].shape = ctypes.cast(shape, POINTER(c_int64))
        out[0].strides = None if strides is None else ctypes.cast(strides, POINTER(c_int64))
        out[0].byte_offset = t.dl_offset
        return 0


def make_dl(hooks: Hooks, **kw: Any) -> tuple:
    """make() reading through the exchange API: (FastCall, the Exchange)."""
    ex = Exchange()
    ntens, nouts = len(kw.get("tensors", ((0, 0, F32),))), len(kw.get("outs", ((1, F32),)))
    dl = kw.pop("dl", (((2, 32),) * ntens, ((2, 32),) * nouts))
    return make(hooks, dlpack=(ex.capsule, *dl), **kw), ex


def floats_at(addr: int, n: int) -> list:
    return list((ctypes.c_float * n).from_address(addr))


# ---- cupy arrays (read_array's cupy branch, cupy_memory, allocate_outputs) -----------------
class EqualDtype:
    """A dtype equal to F32 without being it (NumPy dtypes are compared by equality)."""

    itemsize = 4

    def __eq__(self, other: object) -> bool:
        return other is F32 or isinstance(other, EqualDtype)

    __hash__ = object.__hash__


def cupy_make(hooks: Hooks, device: int = 0, **kw: Any) -> Any:
    kw.setdefault("states", {device: State()})
    return make(hooks, tensor_type=A, flavor="cupy", current_device=lambda: device, **kw)


def test_cupy_dtype_equal_but_not_identical_is_fast(driver) -> None:
    """Kills RA2 (a dtype that is not the very object skipped the equality compare)."""
    hooks = Hooks()
    fc = cupy_make(hooks)
    x = A((2,), EqualDtype())
    z = fc.call((x, 1.0), None, None)
    assert isinstance(z, A) and fc.fast_calls == 1 and not hooks.slow_calls
    assert driver.pointers() == (x.data.ptr, z.data.ptr)


class TwiceDtype(A):
    """dtype: not F32 on its first read (identity fails), raises on the second."""

    @property
    def dtype(self) -> Any:
        self.reads = getattr(self, "reads", 0) + 1
        if self.reads > 1:
            raise KeyError("dtype read again")
        return EqualDtype()

    @dtype.setter
    def dtype(self, value: Any) -> None:
        pass


def test_cupy_dtype_read_error_is_raised(driver) -> None:
    """Kills RA4 (the second dtype read's error left pending while the call went on)."""
    hooks = Hooks()
    fc = make(hooks, tensor_type=TwiceDtype, flavor="cupy", current_device=lambda: 0)
    with pytest.raises(KeyError, match="dtype read again"):
        fc.call((TwiceDtype((2,)), 1.0), None, None)
    assert not driver.launches and not hooks.slow_calls


@pytest.mark.parametrize("dtype, offset", [(F32, 2), (F32, 1), (F64, 4)])
def test_cupy_misaligned_pointers_take_the_general_path(driver, dtype, offset) -> None:
    """A cupy view at a pointer not aligned for its dtype: the general path refuses it (a
    misaligned kernel access poisons the context). Kills RA9, RA10 (alignment check dropped,
    or only its lowest bit kept) and CO9 (out= not checked)."""
    hooks = Hooks()
    fc = cupy_make(hooks, tensors=((0, 0, dtype),), outs=((1, dtype),))
    assert fc.call((A((2,), dtype, offset=offset), 1.0), None, None) == "slow"
    assert fc.call((A((2,), dtype), 1.0), A((2,), dtype, offset=offset), None) == "slow"
    z = A((2,), dtype)
    assert fc.call((A((2,), dtype), 1.0), z, None) is z
    assert fc.fast_calls == 1 and len(hooks.slow_calls) == 2 and len(driver.launches) == 1


class BadMem(A):
    """data.ptr / data.device_id answers set per array."""

    def __init__(self, shape: tuple = (2,), ptr: Any = None, device_id: Any = 0,
                 raises: bool = False) -> None:
        super().__init__(shape)
        if raises:
            del self.data
        else:
            self.data = Mem(self.data.ptr if ptr is None else ptr, device_id)

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name} here")


@pytest.mark.parametrize("kw, error", [
    ({"raises": True}, RuntimeError),       # reading .data raises
    ({"ptr": "0x10"}, TypeError),           # data.ptr not an int
    ({"ptr": -8}, OverflowError),           # data.ptr negative
    ({"device_id": "1"}, TypeError),        # data.device_id not an int
])
def test_cupy_memory_read_errors_are_raised(driver, kw, error) -> None:
    """Kills RA15 (the error handed to the general path, still set), CM1, CM2 (the
    conversion errors ignored)."""
    hooks = Hooks()
    fc = make(hooks, tensor_type=BadMem, flavor="cupy", current_device=lambda: 0)
    with pytest.raises(error):
        fc.call((BadMem((2,), **kw), 1.0), None, None)
    assert not driver.launches and not hooks.slow_calls


def test_cupy_device_is_data_device_id(driver) -> None:
    """Arrays on device 1 with CuPy's current device 1: device 1's state, fast. Kills CM4
    (the device read as 0)."""
    hooks = Hooks()
    fc = cupy_make(hooks, device=1)
    x = A((2,), device=1)
    z = fc.call((x, 1.0), None, None)
    assert fc.fast_calls == 1 and driver.pointers() == (x.data.ptr, z.data.ptr)
    assert fc.call((A((2,), device=0), 1.0), None, None) == "slow"  # not CuPy's current device


class NullOut(A):
    """cupy.ndarray(shape, dtype) whose memory pointer is not an int (an allocated output)."""

    def __init__(self, shape: tuple = (2,), dtype: Any = F32) -> None:
        super().__init__(shape, dtype)
        if shape == (3,):  # the output the program allocates
            self.data = Mem(None, 0)


def test_cupy_allocated_output_pointer_error_is_raised(driver) -> None:
    """Kills OP4 (an allocated output's pointer error ignored: the kernel got garbage)."""
    hooks = Hooks(lambda key: (((3,),), (-1,), (launch(3),), (), False, (0, ()), None))
    fc = make(hooks, tensor_type=NullOut, flavor="cupy", current_device=lambda: 0)
    with pytest.raises(TypeError):
        fc.call((NullOut((2,)), 1.0), None, None)
    assert not driver.launches


TWO_OUT_LAYOUT = ((32, (0, 8, 16, 24), ((0, "Q", 0), (8, "Q", 1), (16, "Q", 2),
                                        (24, "f", 3))),)


#: two outputs' overlap in an entry: one (nbytes, spans) per output (fastpath.FastCore.plan)
NO_OVERLAPS = ((0, ()), (0, ()))


def two_outputs(key) -> tuple:
    (n,), *_ = key
    return (((n,), (n + 1,)), (-1, -1), (launch(n, tmpl=bytes(32)),), (), False, NO_OVERLAPS,
            None)


def test_cupy_outputs_have_their_own_shape_and_dtype(driver) -> None:
    """Kills AO3 (every output of the first output's dtype) and AO6 (of its shape)."""
    hooks = Hooks(two_outputs)
    fc = cupy_make(hooks, n_in=2, floats=((1, 3),), outs=((1, F32), (2, I32)), nvalues=4,
                   layouts=TWO_OUT_LAYOUT)
    driver.sizes = (8, 8, 8, 4)
    x = A((2,))
    z, w = fc.call((x, 1.0), None, None)
    assert (z.shape, z.dtype, w.shape, w.dtype) == ((2,), F32, (3,), I32)
    got = [struct.unpack("<Q", b)[0] for b in driver.launches[-1][3][:3]]
    assert got == [x.data.ptr, z.data.ptr, w.data.ptr]


# ---- torch attribute reads ----------------------------------------------------------------
class Odd(T):
    """get_device() answers ``self.device`` as given (a float, a huge int)."""


@pytest.mark.parametrize("device", [0.0, 1 << 70])
def test_a_device_that_is_no_c_long_is_not_host_memory(driver, device) -> None:
    """get_device() answering a float or an int beyond C long: the general path, even where a
    state for device -1 exists (the failed conversion's -1 is no device). Kills RA11 and DV3
    (a non-int device read as -1) and DV1 (an overflowing one read as -1)."""
    hooks = Hooks()
    fc = make(hooks, states={-1: State(), 0: State()})
    assert fc.call((T((2,), device=device), 1.0), None, None) == "slow"
    assert not driver.launches and fc.fast_calls == 0


# ---- the exchange API (read_dl, dl_contiguous, dl_shape_is, output_pointer) ----------------
def test_dl_strides_decide_contiguity_as_torch_does(driver) -> None:
    """C strides given explicitly, size-1 dims with any stride and empty tensors are
    contiguous; a first dim with a gap is not. Kills DC2 (empty tensors judged by their
    strides), DC3 (size-1 dims' strides checked), DC4 (dim 0 not checked), DC5/DC7 (the
    expected stride not the product of the later dims)."""
    def answer(key):
        shape, = key
        return ((shape,), (0,), (launch(1),), (), False, (0, ()), None)

    hooks = Hooks(answer)
    fc, _ex = make_dl(hooks)
    fast = [T((2, 3), strides=(3, 1)), T((1, 3), strides=(7, 1)), T((3, 1), strides=(1, 9)),
            T((0, 3), strides=(1, 5)), T((2, 3, 4), strides=(12, 4, 1))]
    for x in fast:
        fc.call((x, 1.0), None, None)
        assert not hooks.slow_calls, x.dl_strides
    assert fc.fast_calls == len(fast)
    for strides in ((6, 1), (3, 2), (1, 2)):
        assert fc.call((T((2, 3), strides=strides, contiguous=False), 1.0), None, None) == "slow"
    assert fc.fast_calls == len(fast)


@pytest.mark.parametrize("attrs", [
    {"dl_dtype": (2, 64)},      # float64 for float32: the bits differ
    {"dl_dtype": (1, 32)},      # uint32: the code differs
    {"dl_lanes": 2},            # a vector type
    {"dl_ndim": -1},            # a malformed rank
    {"dl_device": 3},           # pinned host memory (kDLCUDAHost)
    {"dl_device": 1},           # host memory (kDLCPU), though a state for device 0 exists
])
def test_dl_descriptions_the_call_cannot_take_go_to_the_general_path(driver, attrs) -> None:
    """Kills DL3, DL4, DL5 (dtype code, bits or lanes unchecked), DL6 (a negative rank read),
    DL10 (an unknown device type read as a device) and DL12 (host memory read as device 0:
    a host pointer launched on a GPU)."""
    hooks = Hooks()
    fc, _ex = make_dl(hooks, states={0: State()})
    x = T((2,))
    x.__dict__.update(attrs)
    assert fc.call((x, 1.0), None, None) == "slow"
    assert not driver.launches and fc.fast_calls == 0 and not hooks.keys


def test_dl_rank_above_16_goes_to_the_general_path(driver) -> None:
    """Kills DL7 (rank 17 read into the key words)."""
    hooks = Hooks(lambda key: ((key[0],), (0,), (launch(1),), (), False, (0, ()), None))
    fc, _ex = make_dl(hooks)
    assert fc.call((T((1,) * 17), 1.0), None, None) == "slow"
    fc.call((T((1,) * 16), 1.0), None, None)
    assert fc.fast_calls == 1 and len(hooks.slow_calls) == 1


def test_dl_device_id_and_byte_offset_are_read(driver) -> None:
    """A tensor on device 1 (device 1's state, the stream asked of device 1) whose DLTensor
    has a byte offset: the pointer is data + byte_offset. Kills DL9 (device id read as 0),
    DL11 (byte offset dropped), SO2 (the stream asked of device 0)."""
    hooks = Hooks()
    fc, ex = make_dl(hooks, states={1: State()})
    ex.stream = 0x4400
    x = T((2,), device=1, byte_offset=16)
    z = fc.call((x, 1.0), None, None)
    assert fc.fast_calls == 1 and ex.streams == [(2, 1)]
    assert driver.pointers() == (x.data_ptr() + 16, z.data_ptr())
    assert driver.launches[-1][2] == 0x4400


def test_dl_allocated_output_pointer_has_its_byte_offset(driver) -> None:
    """Kills OP1 (an allocated output's byte offset dropped)."""
    hooks = Hooks()
    fc, _ex = make_dl(hooks, empty_like=lambda t: T(t.shape, t.dtype, byte_offset=8))
    x = T((2,))
    z = fc.call((x, 1.0), None, None)
    assert driver.pointers() == (x.data_ptr(), z.data_ptr() + 8)


class Other(T):
    """Not the exchange API's own type: its data_ptr() is asked, not the API."""


def test_dl_output_of_another_type_is_read_by_data_ptr(driver) -> None:
    """hooks.allocate answering another type: the API describes only its own type's
    tensors. Kills OP2."""
    hooks = Hooks(lambda key: (((2,),), (-1,), (launch(2),), (), False, (0, ()), None))
    hooks.allocate = lambda shape, dtype, device: Other(shape, dtype, device, byte_offset=8)
    fc, ex = make_dl(hooks)
    x = T((2,))
    z = fc.call((x, 1.0), None, None)
    assert isinstance(z, Other) and z not in ex.described
    assert driver.pointers() == (x.data_ptr(), z.data_ptr())


@pytest.mark.parametrize("shape", [(), (2, 1), (1, 2), (3,)])
def test_dl_out_of_another_shape_goes_to_the_general_path(driver, shape) -> None:
    """Kills SH1 (the out= rank not compared: a 0-d out= taken for shape (2,))."""
    hooks = Hooks()
    fc, _ex = make_dl(hooks)
    assert fc.call((T((2,)), 1.0), T(shape), None) == "slow"
    assert not driver.launches and fc.fast_calls == 0


def test_out_dtype_is_the_outputs_own(driver) -> None:
    """An int32 output for a float32 input, as out= through the exchange API. Kills CO8 (out=
    compared with the first tensor's DLPack dtype)."""
    hooks = Hooks()
    fc, _ex = make_dl(hooks, outs=((1, I32),), dl=(((2, 32),), ((0, 32),)))
    z = T((2,), I32)
    assert fc.call((T((2,)), 1.0), z, None) is z and fc.fast_calls == 1
    assert fc.call((T((2,)), 1.0), T((2,)), None) == "slow"


# ---- the key of words and the remembered entry -----------------------------------------------
def test_dl_keys_are_the_shapes_and_symbols_exactly(driver) -> None:
    """Two tensors of ranks 3 and 1 and two symbol ints: the key hooks.entry gets is the
    attribute path's. Kills AR1, AR2, AR18 (rank or dims of the words), KW1, KW2, KW3, KW4
    (key_of_words' ranks, symbols and dims)."""
    layout = ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "i", 3))),)

    def answer(key):
        return ((key[0],), (0,), (launch(1),), (), False, (0, ()), None)

    hooks = Hooks(answer)
    driver.sizes = (8, 8, 4)
    ints = ((2, 3, -(1 << 31), (1 << 31) - 1, True), (3, 4, -(1 << 31), (1 << 31) - 1, True))
    fc, _ex = make_dl(hooks, n_in=4, tensors=((0, 0, F32), (1, 1, F32)), floats=(), ints=ints,
                     outs=((2, F32),), nvalues=5, layouts=layout,
                     dl=(((2, 32), (2, 32)), ((2, 32),)))
    fc.call((T((2, 3, 4)), T((5,)), 7, 9), None, None)
    fc.call((T((2, 3, 4)), T((5,)), 7, 8), None, None)
    assert hooks.keys == [((2, 3, 4), (5,), 7, 9), ((2, 3, 4), (5,), 7, 8)]
    # the same keys from the attribute reads
    plain = Hooks(answer)
    fc2 = make(plain, n_in=4, tensors=((0, 0, F32), (1, 1, F32)), floats=(), ints=ints,
               outs=((2, F32),), nvalues=5, layouts=layout)
    fc2.call((T((2, 3, 4)), T((5,)), 7, 9), None, None)
    assert plain.keys == hooks.keys[:1]


def test_dl_last_key_is_compared_whole(driver) -> None:
    """The last call's entry is reused only for the very same words. Kills RE2 (last word not
    compared), RE6 (half the bytes compared), RE7 (half the key copied: a (5,) call's key then
    matched a later (0,) call)."""
    hooks = Hooks()
    fc, _ex = make_dl(hooks)
    for n in (5, 0, 5, 6, 6, 7, 5):
        fc.call((T((n,)), 1.0), None, None)
        assert driver.launches[-1][1][0] == n
    assert hooks.keys == [((5,),), ((0,),), ((6,),), ((7,),)]
    assert fc.fast_calls == 7


# ---- write_param / read_arguments' scalars ---------------------------------------------------
def test_float_scalars_are_written_at_their_precision(driver) -> None:
    """A float64 parameter keeps 0.1 exactly; one too large for float32 stays on the fast
    path (only float32 parameters refuse it); inf is float32's too. Kills AR16 (rounded to
    float32), AR5 (every float checked against float32) and AR6 (inf refused)."""
    layout = ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "d", 2))),)
    hooks = Hooks()
    driver.sizes = (8, 8, 8)
    fc = make(hooks, layouts=layout)
    for v in (0.1, 1e39, -1e300):
        fc.call((T((2,)), v), None, None)
        assert struct.unpack("<d", driver.launches[-1][3][2])[0] == v
    f32 = make(hooks)
    driver.sizes = (8, 8, 4)
    for v in (float("inf"), float("-inf")):
        f32.call((T((2,)), v), None, None)
        assert struct.unpack("<f", driver.launches[-1][3][2])[0] == v
    assert f32.call((T((2,)), 1e39), None, None) == "slow"
    assert fc.fast_calls == 3 and f32.fast_calls == 2


def test_an_int64_beyond_its_range_is_not_minus_one(driver) -> None:
    """2**64 for an int64 parameter overflows: PyLong_AsLongLongAndOverflow answers -1, which
    is in int64's range. Kills AR12 (the overflow flag ignored: -1 launched)."""
    layout = ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "q", 2))),)
    hooks = Hooks()
    fc = make(hooks, floats=(), ints=((1, 2, -(1 << 63), (1 << 63) - 1, False),),
              layouts=layout)
    driver.sizes = (8, 8, 8)
    for v in (1 << 64, -(1 << 64), 1 << 63):
        assert fc.call((T((2,)), v), None, None) == "slow"
    fc.call((T((2,)), -1), None, None)
    assert struct.unpack("<q", driver.launches[-1][3][2])[0] == -1
    assert len(driver.launches) == 1


# ---- hooks.entry's answer: what entry_from / slot_values / scratch_from refuse ---------------
def answer_with(**parts: Any) -> Callable[[tuple], tuple]:
    """default_answer with some of its parts replaced (shapes, likes, launches, views,
    view_out, overlap, scratch, pairs; extra: items appended)."""
    names = ("shapes", "likes", "launches", "views", "view_out", "overlap", "scratch")

    def answer(key):
        base = dict(zip(names, default_answer(key)))
        base.update({k: v for k, v in parts.items() if k in names})
        got = tuple(base[k] for k in names)
        if "pairs" in parts:
            got += (parts["pairs"],)
        return got + parts.get("extra", ())
    return answer


class Truthless:
    def __bool__(self) -> bool:
        raise ZeroDivisionError("no truth")


@pytest.mark.parametrize("parts, error, message", [
    ({"scratch": (64, ((-1, 0),))}, ValueError, "value slot of hooks.entry's scratch"),
    ({"scratch": (64, ((3, 0),))}, ValueError, "value slot of hooks.entry's scratch"),
    ({"overlap": (8, ((-1, 4),))}, ValueError, "value slot of hooks.entry's overlap"),
    ({"scratch": (64, ((2, 0, 9),))}, TypeError, "an item of hooks.entry's scratch"),
    ({"scratch": (64, ((2, "x"),))}, TypeError, None),
    ({"scratch": (64, ((2, -4),))}, OverflowError, None),
    ({"scratch": (64, ((2, 0),), 1)}, TypeError, "scratch is \\(total"),
    ({"overlap": (-1, ())}, OverflowError, None),
    ({"scratch": ("x", ())}, TypeError, None),
    ({"extra": ((), None)}, TypeError, "must answer None or"),
    ({"views": (0, 0, 0)}, TypeError, "wrong kind or length"),
    ({"shapes": ()}, TypeError, "wrong kind or length"),
    ({"likes": (0, 0)}, TypeError, "wrong kind or length"),
    ({"view_out": Truthless()}, ZeroDivisionError, "no truth"),
    ({"views": (-1,)}, ValueError, "a view to check is not an argument"),
    ({"views": (2,)}, ValueError, "a view to check is not an argument"),
    ({"views": ("x",)}, TypeError, None),
    ({"likes": (2,)}, ValueError, "an output's 'like' is not an argument"),
    ({"launches": ((-1, 2, 1, 1, 1, 1, 1, 0, bytes(24)),)}, ValueError, "index is out of range"),
    ({"launches": ((1, 2, 1, 1, 1, 1, 1, 0, bytes(24)),)}, ValueError, "index is out of range"),
    # (session 41: compared before it is narrowed to int; 2**32 was read as launch 0)
    ({"launches": ((1 << 32, 2, 1, 1, 1, 1, 1, 0, bytes(24)),)}, ValueError,
     "index is out of range"),
    ({"launches": ((0, 1 << 32, 1, 1, 1, 1, 1, 0, bytes(24)),)}, OverflowError, "32 bits"),
    ({"launches": ((0, 2, 1, 1, 1, 1, 1, 0, bytes(25)),)}, ValueError, "template is not bytes"),
    ({"launches": ((0, 2, 1, 1, 1, 1, 1, 0, bytes(23)),)}, ValueError, "template is not bytes"),
    ({"shapes": (("x",),)}, TypeError, None),
])
def test_a_malformed_entry_answer_is_an_error(driver, parts, error, message) -> None:
    """hooks.entry's answer is fast_native.py's; a malformed one is its bug, reported as an
    error before anything is launched or cached. Kills SV2 (a total that is no uint64 with
    no pairs after it: its error left pending), SV3 (a negative scratch slot), SV4
    (slot == n_values), SV5 (an item of three), SV7 (an offset that is no int), SV1, EF2 (a
    9-tuple), EF3 (more views than arguments), EF4/EF5 (shapes or likes of another length),
    EF8/EF9/EF19 (views out of range or not ints), EF10 (like ==
    n_in), EF11/EF12 (launch index -1 or == n_layouts), EF14 (a dimension of 2**32), EF15 (a
    template longer than its block), SH4 (an output dimension that is no int, on the
    exchange API's out=)."""
    hooks = Hooks(answer_with(**parts))
    if parts.get("shapes"):  # read on out= through the exchange API (dl_shape_is)
        fc, _ex = make_dl(hooks)
        out = T((2,))
    else:
        fc, out = make(hooks), None
    with pytest.raises(error, match=message):
        fc.call((T((2,)), 1.0), out, None)
    # (an output shape is read only once the entry is made: on out=)
    assert not driver.launches and fc.entries == (out is not None) and fc.fast_calls == 0


# ---- what an entry says reaches the driver ------------------------------------------------
def test_launch_dimensions_and_shared_memory_reach_the_driver(driver) -> None:
    """Kills EF13 (shared memory not read), EF23 (block x/y swapped), LO6, LO7, LO9 (the
    dimensions handed to cuLaunchKernel out of order or dropped)."""
    hooks = Hooks(answer_with(launches=(launch(3, dims=(4, 5, 6, 7, 8, 96)),)))
    make(hooks).call((T((2,)), 1.0), None, None)
    assert driver.launches[-1][1] == (3, 4, 5, 6, 7, 8, 96)


def test_template_values_reach_the_driver(driver) -> None:
    """A parameter the planner computed (from the template, not the call) in the block's last
    bytes. Kills LO1 (the template not copied) and EF17 (its last byte lost)."""
    layout = ((24, (0, 8, 16, 20), ((0, "Q", 0), (8, "Q", 1), (16, "f", 2))),)
    tmpl = block(("Q", 0), ("Q", 0), ("f", 0.0), ("i", -2))
    hooks = Hooks(answer_with(launches=(launch(2, tmpl=tmpl),)))
    driver.sizes = (8, 8, 4, 4)
    x = T((2,))
    z = make(hooks, layouts=layout).call((x, 0.5), None, None)
    got = driver.launches[-1][3]
    assert driver.pointers() == (x.data_ptr(), z.data_ptr())
    assert struct.unpack("<f", got[2])[0] == 0.5 and struct.unpack("<i", got[3])[0] == -2


class Tagged(T):
    """An output made by empty_like (``like``: what it was made like)."""


def two_out_fast(hooks: Hooks, **kw: Any) -> Any:
    return make(hooks, floats=((1, 3),), outs=((1, F32), (2, I32)), nvalues=4,
                layouts=TWO_OUT_LAYOUT, **kw)


def _empty_like(t: T) -> Tagged:
    out = Tagged(t.shape, t.dtype, t.device)
    out.like = t
    return out


@pytest.mark.parametrize("likes", [(0, -1), (-1, -1), (-1, 0)])
def test_each_output_is_allocated_as_its_entry_says(driver, likes) -> None:
    """An output like an input is empty_like(input); the others are hooks.allocate(shape,
    dtype, device) with their own shape and dtype. Kills EF22 (the last like not read), AO1,
    AO2 (like 0 not honoured), AO4 (the first output's dtype), AO7 (its shape), AO9 (no
    device)."""
    def answer(key):
        (n,), = key
        shapes = tuple((n,) if like >= 0 else (n + k + 1,) for k, like in enumerate(likes))
        return (shapes, likes, (launch(n, tmpl=bytes(32)),), (), False, NO_OVERLAPS, None)

    hooks = Hooks(answer)
    driver.sizes = (8, 8, 8, 4)
    fc = two_out_fast(hooks, empty_like=_empty_like, states={1: State()})
    x = T((2,), device=1)
    outs = fc.call((x, 1.0), None, None)
    want = []
    for k, (like, out) in enumerate(zip(likes, outs)):
        if like >= 0:
            assert isinstance(out, Tagged) and out.like is x
        else:
            assert type(out) is T
            want.append(((2 + k + 1,), (F32, I32)[k], 1))
    assert hooks.allocated == want
    got = [struct.unpack("<Q", b)[0] for b in driver.launches[-1][3][:3]]
    assert got == [x.data_ptr(), outs[0].data_ptr(), outs[1].data_ptr()]


def test_an_allocation_failure_releases_the_outputs_made(driver) -> None:
    """Kills AO8 (the outputs made before a failed allocation kept forever)."""
    import weakref

    made: list = []

    def like(t):
        out = _empty_like(t)
        made.append(weakref.ref(out))
        return out

    def refuse(shape, dtype, device):
        raise MemoryError("out of memory")

    hooks = Hooks(lambda key: (((2,), (3,)), (0, -1), (launch(2, tmpl=bytes(32)),), (), False,
                               NO_OVERLAPS, None))
    hooks.allocate = refuse
    fc = two_out_fast(hooks, empty_like=like)
    with pytest.raises(MemoryError):
        fc.call((T((2,)), 1.0), None, None)
    gc.collect()
    assert len(made) == 1 and made[0]() is None and not driver.launches


# ---- the entry cache --------------------------------------------------------------------
class Marked(tuple):
    """An output shape recording its release (its entry was freed)."""

    freed: ClassVar[list] = []

    def __del__(self) -> None:
        Marked.freed.append(tuple(self))


@pytest.mark.parametrize("exchange", [False, True])
def test_the_cache_keeps_256_keys_then_starts_again(driver, exchange) -> None:
    """The 257th distinct key empties the cache (as fastpath.py's dict), and the entries
    dropped are freed. Kills EN2 (never emptied), EN3 (emptied a key later) and RE8 (the
    exchange path's last entry replaced without its reference released: nothing freed)."""
    def answer(key):
        (n,), = key
        return ((Marked((n,)),), (0,), (launch(n),), (), False, (0, ()), None)

    hooks = Hooks(answer)
    fc = make_dl(hooks)[0] if exchange else make(hooks)
    Marked.freed = []
    for n in range(1, 257):
        fc.call((T((n,)), 1.0), None, None)
    assert fc.entries == 256 and not Marked.freed
    fc.call((T((300,)), 1.0), None, None)
    assert fc.entries == 1 and fc.fast_calls == 257
    gc.collect()
    assert len(Marked.freed) >= 255  # (the last call's entry may still be held as the last)


class HashRaises(tuple):
    def __hash__(self) -> int:
        raise LookupError("unhashable shape")


class HashTensor(T):
    @property
    def shape(self) -> tuple:
        return HashRaises(self._shape)

    @shape.setter
    def shape(self, value: tuple) -> None:
        self._shape = value


def test_a_key_that_cannot_be_hashed_raises_its_error(driver) -> None:
    """Kills EN1 (the lookup's error ignored: hooks.entry called with it pending)."""
    hooks = Hooks()
    fc = make(hooks, tensor_type=HashTensor)
    with pytest.raises(LookupError, match="unhashable shape"):
        fc.call((HashTensor((2,)), 1.0), None, None)
    assert not hooks.keys and not driver.launches


# ---- scratch --------------------------------------------------------------------------------
SCRATCH_LAYOUT = ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "Q", 2))),)


@pytest.mark.parametrize("nbytes, offset", [(0, 0), (64, 16), (64, 0)])
def test_scratch_is_one_allocation_on_the_devices_stream(driver, nbytes, offset) -> None:
    """An empty scratch allocates nothing (its buffers are null); otherwise
    hooks.scratch(nbytes, device) and the buffer at its offset. Kills AS1 (an empty scratch
    allocated), AS4 (no device), AS5 (the first buffer's slot not written)."""
    hooks = Hooks(answer_with(scratch=(nbytes, ((2, offset),))))
    driver.sizes = (8, 8, 8)
    fc = make(hooks, floats=(), n_in=1, layouts=SCRATCH_LAYOUT, scratch=(2,),
              states={1: State()})
    fc.call((T((2,), device=1),), None, None)
    s = struct.unpack("<Q", driver.launches[-1][3][2])[0]
    if nbytes:
        assert hooks.scratches == [(nbytes, 1)] and s == hooks.scratch_base + offset
    else:
        assert hooks.scratches == [] and s == 0


# ---- out= and streams ------------------------------------------------------------------
def test_out_on_another_device_goes_to_the_general_path(driver) -> None:
    """Kills CO4 (out='s device not compared with the inputs')."""
    hooks = Hooks()
    fc = make(hooks, states={0: State(), 1: State()})
    assert fc.call((T((2,)), 1.0), T((2,), device=1), None) == "slow"
    assert not driver.launches


def test_one_out_for_two_outputs_goes_to_the_general_path(driver) -> None:
    """Kills CO1 (a single out= taken for the first of two outputs: the second's pointer
    never written)."""
    hooks = Hooks(two_outputs)
    fc = two_out_fast(hooks)
    assert fc.call((T((2,)), 1.0), T((2,)), None) == "slow"
    assert not driver.launches


@pytest.mark.parametrize("overlap, error, message", [
    ((0, ()), TypeError, "overlap is \\(total"),  # a pair of two items, neither a pair
    (((0, ()),), TypeError, "one \\(total, spans\\) per output"),
    (((0, ()), (8, ((9, 4),))), ValueError, "value slot of hooks.entry's overlap"),
    (((0, ()), (8, ((0, 4),)), (0, ())), TypeError, "per output"),
])
def test_two_outputs_overlap_is_one_pair_per_output(driver, overlap, error, message) -> None:
    """With several outputs hooks.entry's overlap holds one (nbytes, spans) per output
    (fastpath.FastCore.plan); any other form is a malformed answer, reported as such."""
    def answer(key):
        (n,), *_ = key
        return (((n,), (n,)), (-1, -1), (launch(n, tmpl=bytes(32)),), (), False, overlap,
                None)
    fc = two_out_fast(Hooks(answer))
    with pytest.raises(error, match=message):
        fc.call((T((2,)), 1.0), None, None)
    assert not driver.launches


def test_two_out_arrays_are_checked_each_against_its_own_spans(driver) -> None:
    """out=(z, w): each array against its own output's size and input spans, and the two
    against each other; a fit writes both pointers."""
    x = T((2,))
    def answer(key):
        (n,), *_ = key
        # z may be x itself (in-place use); w may not share any byte with x (flagged)
        spans = (((0, 8),), ((0, 8 | (1 << 63)),))
        return (((n,), (n,)), (-1, -1), (launch(n, tmpl=bytes(32)),), (), False,
                ((8, spans[0]), (8, spans[1])), None)
    hooks = Hooks(answer)
    fc = two_out_fast(hooks)
    driver.sizes = (8, 8, 8, 4)
    z, w = T((2,)), T((2,), I32)
    assert fc.call((x, 1.0), (z, w), None) == (z, w)
    got = [struct.unpack("<Q", b)[0] for b in driver.launches[-1][3][:3]]
    assert got == [x.data_ptr(), z.data_ptr(), w.data_ptr()]
    assert fc.call((x, 1.0), (x, w), None) == (x, w)  # z over x: allowed
    assert len(driver.launches) == 2 and not hooks.slow_calls
    assert fc.call((x, 1.0), (z, T((2,), I32, ptr=x.data_ptr())), None) == "slow"
    assert fc.call((x, 1.0), (z, T((2,), I32, ptr=z.data_ptr() + 4)), None) == "slow"
    assert fc.call((x, 1.0), [z, w], None) == "slow"  # a list: the general path's
    assert fc.call((x, 1.0), (z, T((3,), I32)), None) == "slow"
    assert fc.call((x, 1.0), (z, T((2,), F32)), None) == "slow"
    assert len(driver.launches) == 2 and fc.fast_calls == 2


def test_the_callers_stream_is_asked_with_the_device(driver) -> None:
    """hooks.stream_handle(stream, device) (it refuses another device's stream); its error
    is raised. Kills SO3 (no device), SO4 (a handle that is no uint64 ignored), FR14 (the
    stream's error ignored by the call), SO8 (the exchange API's current stream taken instead
    of stream=)."""
    for exchange in (False, True):
        hooks = Hooks()
        fc, ex = make_dl(hooks) if exchange else (make(hooks), None)
        fc.call((T((2,)), 1.0), T((2,)), 0x77)  # (an output to allocate: the general path)
        assert driver.launches[-1][2] == 0x77 and hooks.streams[-1] == (0x77, 0)
        assert ex is None or ex.streams == []
    n = len(driver.launches)
    with pytest.raises(OverflowError):
        fc.call((T((2,)), 1.0), T((2,)), -1)
    assert len(driver.launches) == n


def test_the_current_stream_of_the_device(driver) -> None:
    """raw_stream(device) on the attribute path. Kills SO6."""
    asked = []
    fc = make(Hooks(), raw_stream=lambda d: asked.append(d) or 0x99, states={1: State()})
    fc.call((T((2,), device=1), 1.0), None, None)
    assert driver.launches[-1][2] == 0x99 and asked == [1]


def test_more_arguments_than_the_program_takes_go_to_the_general_path(driver) -> None:
    """Kills FR2."""
    hooks = Hooks()
    assert make(hooks).call((T((2,)), 1.0, 2.0), None, None) == "slow"
    assert not driver.launches


class EvilKey:
    """A states key equal to device 0 by hash whose comparison raises."""

    def __hash__(self) -> int:
        return hash(0)

    def __eq__(self, other: object) -> bool:
        raise ArithmeticError("no comparing")


def test_a_states_lookup_error_is_raised(driver) -> None:
    """Kills FR11 (the lookup's error left pending while the general path ran)."""
    hooks = Hooks()
    fc = make(hooks, states={EvilKey(): State()})
    with pytest.raises(ArithmeticError, match="no comparing"):
        fc.call((T((2,)), 1.0), None, None)
    assert not hooks.slow_calls


# ---- function handles ---------------------------------------------------------------------
def test_each_launch_uses_its_layouts_function(driver) -> None:
    """Launches of layouts 1 then 0, on a fresh state and on the remembered one. Kills FO2,
    FO3 (the handle by launch position, not layout) and LA9."""
    hooks = Hooks(answer_with(launches=(launch(2, j=1), launch(2, j=0))))
    fc = make(hooks, layouts=LAYOUT * 2)
    for _ in range(2):
        fc.call((T((2,)), 1.0), None, None)
    assert [f for f, *_ in driver.launches] == [FUNCS[1], FUNCS[0]] * 2


def test_a_function_list_of_another_length_is_refused(driver) -> None:
    """Kills FO5 and LA12 (the function list's error ignored: launched anyway)."""
    fc = make(Hooks(), states={0: State(2)})
    with pytest.raises(ValueError, match="function list does not match"):
        fc.call((T((2,)), 1.0), None, None)
    assert not driver.launches


def test_a_replaced_device_state_is_released(driver) -> None:
    """Kills FO4 (the state whose handles are remembered not recorded: a reference taken on
    every call, never released)."""
    import weakref

    states = {0: State()}
    hooks = Hooks()
    fc = make(hooks, states=states)
    fc.call((T((2,)), 1.0), None, None)
    gone = weakref.ref(states[0])
    states[0] = State()
    fc.call((T((2,)), 1.0), None, None)
    hooks.lost.clear()
    gc.collect()
    assert gone() is None and len(driver.launches) == 2


# ---- contexts: pushed and popped, failures ------------------------------------------------
def test_a_pushed_context_is_popped_after_the_launches(driver) -> None:
    """context_was_lost answering 2 (PUSHED): pop_context(state) after the launches, every
    call (a pushed context is never remembered); a pop that raises still returns the result.
    Kills LA7, LA11 (no pop), LA6 (a pushed context remembered), WPU1 (True read as pushed),
    PC2 (the pop's error left set with a result)."""
    hooks = Hooks()
    hooks.context = 2
    st = State()
    fc = make(hooks, states={0: st})
    for _ in range(2):
        fc.call((T((2,)), 1.0), None, None)
    assert hooks.popped == [st, st] and len(hooks.lost) == 2

    def refuse(st):
        raise RuntimeError("pop failed")

    hooks.pop_context = refuse
    z = fc.call((T((2,)), 1.0), None, None)
    assert isinstance(z, T) and len(driver.launches) == 3
    hooks2 = Hooks()
    hooks2.context = True  # set again: nothing pushed, nothing to pop
    fc2 = make(hooks2)
    _launch.forget_contexts()
    fc2.call((T((2,)), 1.0), None, None)
    assert hooks2.popped == [] and len(hooks2.lost) == 1


def test_a_failed_launch_with_a_pushed_context_raises_the_launch_error(driver) -> None:
    """The launch error survives the pop (Python code). Kills PC1, PC3."""
    hooks = Hooks()
    hooks.context = 2
    fc = make(hooks)
    driver.errors = [700]
    with pytest.raises(Failed):
        fc.call((T((2,)), 1.0), None, None)
    assert len(hooks.popped) == 1


def test_a_failed_launch_stops_the_call_and_names_the_launch(driver) -> None:
    """The second of three launches fails: hooks.launch_failed(err, j, dims...) and nothing
    after it is launched. Kills LA8 (later launches made), RC7, RC8, RC9 (the error, the
    launch or its dimensions misreported)."""
    hooks = Hooks(answer_with(launches=(launch(2, j=0), launch(3, j=1, dims=(4, 5, 6, 7, 8, 9)),
                                        launch(2, j=2))))
    fc = make(hooks, layouts=LAYOUT * 3, trust=False)
    driver.errors = [0, 701]
    with pytest.raises(Failed):
        fc.call((T((2,)), 1.0), None, None)
    assert hooks.failed == [(701, 1, 3, 4, 5, 6, 7, 8, 9)]
    assert len(driver.launches) == 2 and fc.fast_calls == 0


def test_dl_second_tensor_of_unknown_device_type_goes_to_the_general_path(driver) -> None:
    """The first tensor on device 0, the second in pinned host memory (kDLCUDAHost): its
    device is never read as the first's. Kills DL10 (an unknown device type left the last
    device read in place: both "on device 0")."""
    layout = ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "Q", 2))),)
    hooks = Hooks(lambda key: ((key[0],), (0,), (launch(1),), (), False, (0, ()), None))
    driver.sizes = (8, 8, 8)
    fc, _ex = make_dl(hooks, tensors=((0, 0, F32), (1, 1, F32)), floats=(), outs=((2, F32),),
                     layouts=layout, dl=(((2, 32), (2, 32)), ((2, 32),)))
    y = T((2,))
    y.dl_device = 3
    assert fc.call((T((2,)), y), None, None) == "slow"
    assert fc.call((T((2,)), T((2,))), None, None) is not None and fc.fast_calls == 1


def test_dl_last_key_of_a_0d_tensor_and_a_symbol(driver) -> None:
    """Words (0, k): a 0-d tensor and a symbol. Kills RE3 (the last key never copied: it stays
    zeros, so k == 0 matched whatever entry was last)."""
    layout = ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "i", 2))),)
    hooks = Hooks(lambda key: (((),), (0,), (launch(key[1]),), (), False, (0, ()), None))
    fc, _ex = make_dl(hooks, floats=(), ints=((1, 2, -(1 << 31), (1 << 31) - 1, True),),
                     layouts=layout)
    for k in (3, 0, 0, 3):
        fc.call((T(()), k), None, None)
        assert driver.launches[-1][1][0] == k
    assert hooks.keys == [((), 3), ((), 0)]


# ---- _fdowner.c: owned_dup / FdOwner ------------------------------------------------------
def _fdowner() -> Any:
    if not hasattr(_launch, "owned_dup"):
        pytest.skip("the extension predates owned_dup")
    return _launch


def _is_open(fd: int) -> bool:
    import os

    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_fdowner_closes_on_close_and_on_release_once() -> None:
    """Kills FD1 (never closed on release), FD5 (close() closing nothing) and FD4 (close()
    leaving the descriptor recorded: fileno() answered a closed number)."""
    import os

    launch = _fdowner()
    r, w = os.pipe()
    try:
        owner = launch.owned_dup(r)
        fd = owner.fileno()
        assert fd not in (r, w) and _is_open(fd)
        owner.close()
        assert not _is_open(fd)
        with pytest.raises(ValueError, match="closed"):
            owner.fileno()
        owner = launch.owned_dup(r)
        fd = owner.fileno()
        del owner
        gc.collect()
        assert not _is_open(fd) and _is_open(r)
    finally:
        os.close(r)
        os.close(w)


def test_fdowner_refuses_numbers_beyond_int() -> None:
    """2**32 + fd is no descriptor (cast to int it would be fd). Kills FD7."""
    import os

    launch = _fdowner()
    r, w = os.pipe()
    try:
        for bad in ((1 << 32) + r, (1 << 33) + w):
            with pytest.raises(ValueError, match="is not a file descriptor"):
                launch.owned_dup(bad)
    finally:
        os.close(r)
        os.close(w)


def test_fdowner_type_references_balance() -> None:
    """Each FdOwner holds its heap type, released with it; a failed dup keeps no owner.
    Kills FD15 (the type never released) and FD17 (the owner of a failed dup leaked)."""
    import os

    launch = _fdowner()
    r, w = os.pipe()
    closed = os.dup(r)
    os.close(closed)
    counts = []
    try:
        for _ in range(3):
            for _ in range(50):
                launch.owned_dup(r)
                try:
                    launch.owned_dup(closed)
                except OSError as exc:
                    assert exc.errno == 9
                else:
                    raise AssertionError("a closed descriptor was duplicated")
            gc.collect()
            counts.append(sys.getrefcount(launch.FdOwner))
        assert counts[0] == counts[1] == counts[2], counts
    finally:
        os.close(r)
        os.close(w)


_FD0 = r'''
import json, os, sys
from kernelpack.runtime._launch import owned_dup
r, w = os.pipe()
out = {}
# a failed dup never closes descriptor 0 (the owner's field before the dup)
closed = os.dup(r); os.close(closed)
try:
    owned_dup(closed)
except OSError as exc:
    out["failed"] = exc.errno
import gc; gc.collect()
out["stdin_open_after_failure"] = os.fstat(0) is not None
# with descriptor 0 free, the duplicate may be 0: it is owned like any other
os.close(0)
owner = owned_dup(r)
out["fileno"] = owner.fileno()
owner = None
gc.collect()
try:
    os.fstat(0)
    out["zero_closed"] = False
except OSError:
    out["zero_closed"] = True
print(json.dumps(out))
'''


def test_fdowner_descriptor_0_is_owned_like_any_other(tmp_path) -> None:
    """In a child process: a failed dup leaves descriptor 0 alone; with descriptor 0 free the
    duplicate is 0, fileno() answers it and the release closes it. Kills FD9 (the owner's
    field 0 until the dup: a failed dup closed stdin), FD2/FD20 (0 never closed), FD3
    (fileno() refusing 0) and FD19 (the duplicate kept above 2)."""
    import json
    import os
    import subprocess

    _fdowner()
    stdin = tmp_path / "stdin"
    stdin.write_text("x")
    with open(stdin, "rb") as f:
        proc = subprocess.run([sys.executable, "-c", _FD0], stdin=f, capture_output=True,
                              text=True, timeout=60, env=dict(os.environ), check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"failed": 9, "stdin_open_after_failure": True, "fileno": 0,
                   "zero_closed": True}, out


class Seven(int):
    """An int subclass whose conversion (the general path's) is not its stored value."""

    def __index__(self) -> int:
        return 7

    __int__ = __index__


def test_int_and_float_subclasses_go_to_the_general_path(driver) -> None:
    """bool, an int subclass, a float subclass: never read here (their own conversions are the
    general path's). Kills AR9 (int subclasses read as their stored value)."""
    layout = ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "i", 2))),)
    hooks = Hooks()
    fc = make(hooks, floats=(), ints=((1, 2, -(1 << 31), (1 << 31) - 1, False),),
              layouts=layout)
    for v in (True, Seven(3)):
        assert fc.call((T((2,)), v), None, None) == "slow"
    fc.call((T((2,)), 3), None, None)
    assert fc.fast_calls == 1 and len(driver.launches) == 1

    class F(float):
        pass

    f = make(Hooks())
    assert f.call((T((2,)), F(1.5)), None, None) == "slow"


def test_the_context_is_checked_on_the_three_default_streams_only(driver) -> None:
    """Handles 0, 1 (legacy) and 2 (per-thread) launch into the thread's current context: it is
    asked for (untrusted: every call); any other stream carries its own. Kills LA1 (handle 2
    not asked) and LA2 (handle 3 asked)."""
    hooks = Hooks()
    fc = make(hooks, trust=False)
    for handle, asked in ((0, 1), (1, 1), (2, 1), (3, 0), (0x77, 0)):
        before = len(hooks.lost)
        fc.call((T((2,)), 1.0), T((2,)), handle)
        assert len(hooks.lost) - before == asked, handle
        assert driver.launches[-1][2] == handle


class ConjRaises(T):
    def is_conj(self) -> bool:
        raise PermissionError("is_conj refused")


def test_a_lazy_view_check_error_on_out_is_raised(driver) -> None:
    """Kills CO7 (out='s is_conj() error handed to the general path, still pending)."""
    hooks = Hooks(answer_with(view_out=True))
    fc = make(hooks, tensor_type=ConjRaises)
    with pytest.raises(PermissionError, match="is_conj refused"):
        fc.call((ConjRaises((2,)), 1.0), ConjRaises((2,)), None)
    assert not driver.launches and not hooks.slow_calls


def test_a_remembered_context_is_the_devices_own(driver) -> None:
    """The context a thread confirmed is remembered with its device: a launch on another
    device asks again; a failed launch is retried only on the remembered device's context
    and on a default stream. Kills LA3 (the device not compared), RC2 (a failure on another
    device, untrusted, taken for a lost remembered context) and RC1 (a failure on an explicit
    stream taken for one)."""
    hooks = Hooks()
    fc = make(hooks, states={0: State(), 1: State()})
    fc.call((T((2,)), 1.0), None, None)
    fc.call((T((2,)), 1.0), None, None)
    assert len(hooks.lost) == 1  # device 0's context: confirmed once
    fc.call((T((2,), device=1), 1.0), None, None)
    assert len(hooks.lost) == 2  # another device: asked again
    fc.call((T((2,)), 1.0), None, None)
    assert len(hooks.lost) == 3  # and device 0's asked again after it
    # a failure on an explicit stream: the launch error, no context question
    driver.errors = [700]
    with pytest.raises(Failed):
        fc.call((T((2,)), 1.0), T((2,)), 0x77)
    assert len(hooks.lost) == 3 and hooks.failed[-1][0] == 700
    # an untrusted program on device 1 while device 0 is remembered: its failure is raised
    other = Hooks()
    other.context = True  # would have the launch repeated, were it asked after the failure
    fc1 = make(other, trust=False, states={1: State()})
    fc.call((T((2,)), 1.0), None, None)  # device 0 remembered again
    n = len(driver.launches)
    driver.errors = [700]
    with pytest.raises(Failed):
        fc1.call((T((2,), device=1), 1.0), None, None)
    assert len(other.lost) == 1 and len(driver.launches) == n + 1


def test_a_failed_launch_on_a_remembered_context_is_checked_and_repeated(driver) -> None:
    """A launch failing on the remembered context: the context is asked for again; changed
    (True), the launch is repeated once and the context remembered again; pushed (2), the
    repeat is followed by pop_context; unchanged, or the repeat failing, the launch error.
    Kills RC3 (the failed context still remembered), RC4/RC11 (a pushed retry not popped),
    RC6 (the repeat's failure ignored: a result for a kernel that never ran), RC13 (the
    recovered context not remembered), RC5 (an untrusted program's recovery remembered)."""
    hooks = Hooks()
    st = State()
    fc = make(hooks, states={0: st})
    x = T((2,))
    fc.call((x, 1.0), None, None)
    assert len(hooks.lost) == 1
    # unchanged: the launch error, and the context is asked for on the next call
    driver.errors = [700]
    with pytest.raises(Failed):
        fc.call((x, 1.0), None, None)
    assert len(hooks.lost) == 2 and hooks.failed[-1][0] == 700
    fc.call((x, 1.0), None, None)
    assert len(hooks.lost) == 3
    # changed: repeated once, then remembered (the next call asks nothing)
    hooks.context = True
    driver.errors = [700]
    n = len(driver.launches)
    assert isinstance(fc.call((x, 1.0), None, None), T)
    assert len(driver.launches) == n + 2 and len(hooks.lost) == 4
    fc.call((x, 1.0), None, None)
    assert len(hooks.lost) == 4
    # changed but the repeat fails too: its error
    driver.errors = [700, 719]
    with pytest.raises(Failed):
        fc.call((x, 1.0), None, None)
    assert hooks.failed[-1][0] == 719
    # pushed: repeated, then popped
    hooks.context = False
    fc.call((x, 1.0), None, None)  # remembered again
    hooks.context = 2
    driver.errors = [700]
    assert isinstance(fc.call((x, 1.0), None, None), T)
    assert hooks.popped == [st]
    # an untrusted program recovering on the context a trusted one remembered: not kept
    hooks.context = False
    fc.call((x, 1.0), None, None)
    other = Hooks()
    other.context = True
    fu = make(other, trust=False)
    driver.errors = [700]
    fu.call((x, 1.0), None, None)  # recovered (asked once, after the failure)
    fu.call((x, 1.0), None, None)  # asked again: nothing was remembered for it
    assert len(other.lost) == 2


def test_outputs_for_another_stream_come_from_its_pool(driver) -> None:
    """stream= with outputs to allocate: each by hooks.allocate(shape, dtype, device, handle),
    from that stream's pool (a block of the current stream's may still be in use by work
    queued there), none by empty_like, and the launch on that stream writes it (until session
    43 such calls were the general path's). Kills FR1 (allocated on the current stream's
    pool)."""
    hooks = Hooks()
    fc = make(hooks, empty_like=lambda t: pytest.fail("empty_like for a stream= output"))
    z = fc.call((T((2,)), 1.0), None, 0x77)
    assert isinstance(z, T) and hooks.allocated == [((2,), F32, 0, 0x77)]
    assert driver.launches[-1][2] == 0x77 and fc.fast_calls == 1
    assert struct.unpack("<Q", driver.launches[-1][3][1])[0] == z.data_ptr()
    out = T((2,))
    assert fc.call((T((2,)), 1.0), out, 0x77) is out and driver.launches[-1][2] == 0x77
    assert len(hooks.allocated) == 1


class CupyHooks(Hooks):
    """Hooks whose allocate (and scratch, with or without a handle) make cupy-like arrays."""

    def allocate(self, shape, dtype, device, stream=None):
        self.allocated.append((shape, dtype, device, stream))
        return A(shape, dtype, device)

    def scratch(self, nbytes, device, handle=None):
        self.scratches.append((nbytes, device, handle))
        return A((nbytes,), F32, device)


def test_cupy_outputs_for_another_stream_come_from_its_arena(driver) -> None:
    """CuPy's FastCall makes its outputs itself (cupy.ndarray) on CuPy's current stream; with
    stream= and outputs to allocate, each comes from hooks.allocate(shape, dtype, device,
    handle), that stream's arena of CuPy's pool (until session 44 the general path's)."""
    hooks = CupyHooks()
    fc = cupy_make(hooks)
    z = fc.call((A((2,)), 1.0), None, 0x77)
    assert isinstance(z, A) and hooks.allocated == [((2,), F32, 0, 0x77)]
    assert driver.launches[-1][2] == 0x77 and fc.fast_calls == 1 and not hooks.slow_calls
    assert driver.pointers()[1] == z.data.ptr
    z2 = fc.call((A((2,)), 1.0), None, None)  # without stream=: cupy.ndarray, no hook
    assert isinstance(z2, A) and len(hooks.allocated) == 1 and fc.fast_calls == 2


@pytest.mark.parametrize("handle", [0, 1, 2])
def test_cupy_stream_outputs_with_scratch_on_a_default_stream_allocate_nothing(
        driver, handle) -> None:
    """CuPy's scratch for stream= is the driver's stream-ordered memory, which on a default
    stream needs the context current: the general path's. Such a call with outputs to
    allocate goes there before any output is allocated (not after, throwing them away)."""
    hooks = CupyHooks(answer_with(scratch=(64, ((2, 0),))))
    driver.sizes = (8, 8, 8)
    fc = cupy_make(hooks, floats=(), n_in=1, layouts=SCRATCH_LAYOUT, scratch=(2,))
    assert fc.call((A((2,)),), None, handle) == "slow"
    assert not hooks.allocated and not hooks.scratches and not driver.launches
    z = fc.call((A((2,)),), None, 0x77)  # another stream: allocated and launched there
    assert isinstance(z, A) and hooks.allocated == [((2,), F32, 0, 0x77)]
    assert hooks.scratches == [(64, 0, 0x77)] and driver.launches[-1][2] == 0x77
