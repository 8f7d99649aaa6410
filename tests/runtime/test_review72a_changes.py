"""Review 72a (session 57): a diff-reading review of the runtime's changes since fc9220a.

Read: ``git diff fc9220a..HEAD`` (25 commits touch these files) of runtime/{arrays, fast_cupy,
fast_native, fast_torch, fastpath, in_place, aliasing, execute, _fastcall.c, _fastcall.h},
launches, summary, serializer, external, targets, toolchain/nvjitlink, dtypes, compiled,
compile_entry, limits, with each commit's message. The changes: outputs and scratch for
``stream=`` on every fast path (7c35d2c, a24e3e3, 02ccc3e, 66410c9, edeaea7: torch from that
stream's pool through ``TorchAdapter.tensor_on``/``scratch``, CuPy from its arena through
``CupyAdapter.array_on``, stream-ordered CuPy scratch), torch pool blocks as scratch
(3240736, 13a5f7b, 7e23f05, 178acc0: ``_PoolBlock``), ``out=`` tuples on the fast paths
(346febd: ``outs_conflict``, C ``check_out``/``overlaps_from``), format 1.1's
``Launch.reads_elsewhere`` / ``stores_after_loads`` (ce6d73e, fde7911, f9ed1d6: in_place's
fourth rule, ``serializer.format_minor``, ``resign`` keeping a file's minor), the frozen
dataclasses (7ef95c6), nvJitLink's ``resource_usage`` / ``_assembled`` (e4e6244, 7c27c8e),
FastCall's launch index check (1d32552), aliasing's inlined test (0fd2fe7).

Method: every suspicion run black-box where possible, on CPU: the stand-in torch/CuPy of
tests/runtime/test_fastpath_fake.py over the fake driver, on each fast path (C ``FastCall``
with attribute reads, C through DLPack's exchange API, the Python closures), the first call
of each program being the general path's (its answer is the reference).

Findings (strict xfails when found; all four fixed in session 57, the tests now pass):

1. test_an_out_namedtuple_gets_the_general_paths_plain_tuple: the C ``FastCall`` takes an
   ``out=`` *subclass* of tuple (a namedtuple; torch's structseqs) for a program of several
   outputs (``PyTuple_Check`` in ``check_out``, 346febd) and returns that object, where the
   general path (and the closure, ``out.__class__ is tuple``) returns a plain tuple of the
   arrays. Fixed: ``PyTuple_CheckExact`` in ``check_out``, as the closures test the class.
2. test_reads_elsewhere_given_as_a_set_saves_the_same_bytes_in_every_process:
   ``Launch(reads_elsewhere=...)`` (and ``kp.external(reads_elsewhere=...)``, typed
   ``Iterable[str]``) keeps the iteration order it is given, and the encoder writes it as
   is: a set of names (what the field means) gives another artifact per PYTHONHASHSEED,
   against DESIGN.md's deterministic bytes; the same names in two orders are two unequal
   Launches and two files. (ce6d73e / f9ed1d6.) Fixed in session 57: the names are kept
   sorted (``Launch._check_reads_elsewhere``).

3. (minor) test_a_stream_of_another_device_with_a_bad_handle_is_the_general_paths_error:
   FastCall's ``hooks.stream_handle`` (fast_native.Hooks) checks a stream object's device
   before reading its handle; the general path reads the handle first. Only a stream object
   that both names another device and holds no valid handle tells them apart (LaunchError
   vs ValueError/TypeError). The order predates fc9220a for ``out=`` calls; a24e3e3/02ccc3e
   made calls without ``out=`` reach it. Fixed: the hook reads the handle first.

4. test_an_interrupt_while_cupy_scratch_is_taken_frees_it_once: review 62's
   interrupt sweep over ``fast_cupy._ordered_scratch`` (rewritten owner-first in 7e23f05 and
   178acc0, reached on every CuPy call with scratch and ``stream=`` since 7c35d2c): no
   boundary frees twice any more, but 39 boundaries leak the stream-ordered allocation
   (the pointer reaches its owner only after ``_drv.check`` returns; a SIGINT raised as
   ``cuMemAllocAsync``'s CALL ends is one of them). Review 62 called the same window in
   torch's scratch a bug and closed it with ``held.extend(map(raw_alloc, ...))``. Fixed: the
   same one-C-call store of the driver's answer into the owner (``driver.allocate_ordered``,
   which ``execute._temporary``'s stream-ordered branch, with the same window, now uses too).

Finding 2 also holds through the public ``kp.external(..., reads_elsewhere={"x", "y"},
targets=["sm_80"])``: PYTHONHASHSEED 0 and 1 give ('y', 'x') / ('x', 'y') and two file
digests (run by hand; the test uses the data model to stay fast).

Stale documentation (no test; corrected in session 57):
- runtime/fastpath.py's module docstring still lists "CuPy's ``stream=`` without ``out=``"
  among what falls back to the general path; since 02ccc3e such calls take the fast paths.
- README's "a CuPy call with scratch and ``stream=0`` or ``1`` (a default stream)" goes to
  the general path: the code (C and closure) tests ``handle < 3``, so ``stream=2``
  (CU_STREAM_PER_THREAD) does too.
- _fastcall.c's header says a stream of another device "goes to the general path"; FastCall
  raises the general path's LaunchError itself through ``hooks.stream_handle`` (same words).

Checked and right (ordinary tests here):
- ``stream=`` errors on every fast path (C, C-dlpack, closure; torch and CuPy; with and
  without ``out=``): -1, 2**64, bool, float, str, NumPy float, a broken ``__cuda_stream__``,
  a stream of another device: the general path's class and words, nothing launched
  (test_a_bad_stream_is_the_general_paths_error_on_every_{torch,cupy}_path).
- ``out=`` tuples (346febd) against the general path, 150 random calls per program and
  path over regions of one buffer (same region, partial overlaps, disjoint, an output over
  an input), for a kernel that loads first (``stores_after_loads``), one that stores ``s``
  before reloading for ``d`` (no flag: in place needs a copy) and one reading ``x``
  reversed (``reads_elsewhere``): same bytes, same errors, 21-79 calls launched by the fast
  path itself (test_{,cupy_}out_tuples_over_shared_memory_answer_as_the_general_path).
- An ``inout`` argument over an input read elsewhere (ce6d73e's fourth rule through
  ``written_pairs``): same sweep (test_an_inout_argument_over_an_input_read_elsewhere_...).
- aliasing.py's inlined ``p0 != p1 or n0 != n1`` (0fd2fe7) is ``partially_overlaps`` given
  ``overlaps`` (read); resign keeps a file's minor (read); FORMAT.md and README describe
  1.1's fields as the code does (read); nvjitlink.resource_usage parsed ptxas -v right for
  two entries and a non-entry function (run by hand, not kept: tooling, not the runtime).

GPU only (marked ``gpu``, skipped here; for the lead's H200):
- test_gpu_an_out_namedtuple_gets_a_plain_tuple: finding 1 with real torch and the built
  extension (a strict xfail unless KERNELPACK_NATIVE_LAUNCH=0, where the closure passes).
- test_gpu_graph_capture_with_an_explicit_stream_and_scratch: ``stream=`` the capture
  stream, scratch from ``raw_alloc(nbytes, handle)`` and an output from that stream's pool
  inside ``torch.cuda.graph``; replays right (TorchAdapter.scratch's "a captured stream gets
  its graph's private pool either way" is not CPU-checkable).
- test_gpu_cupy_stream_outputs_leave_cupys_with_block_alone: ``array_on``'s ``use()`` /
  ``before.use()`` inside a ``with stream:`` block of real CuPy.

Not reached: a differential of ``stream=`` without ``out=`` (outputs' pools, launch stream)
beyond the existing tests (test_torch_stream_outputs.py, test_cupy_stream_outputs.py,
test_review61_stream_scratch.py cover it); the frozen dataclasses (review 67 compared them);
nvjitlink beyond one hand run; format 1.1 decoding of hostile files (test_review28_format.py
covers reads_elsewhere's checks).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from interrupt_at import run_interrupted  # noqa: E402
from test_fastpath_fake import (NDArray, Tensor, _install_cupy, make_torch,  # noqa: E402
                                select_path)
from test_several_outs_fast import _sumdiff_impl, sumdiff  # noqa: E402

from kernelpack.runtime import call_program  # noqa: E402
from kernelpack.runtime.launcher import BoundProgram, bind  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


# ---- fixtures --------------------------------------------------------------------------------
@pytest.fixture(params=["C", "C-dlpack", "closure"])
def path(request, monkeypatch) -> str:
    """The torch/CuPy fast path a test runs on (C, C through DLPack's exchange API for the
    stand-in torch tensors, the Python closures)."""
    which = select_path(request.param, monkeypatch)
    if which == "C-dlpack":
        from dlpack_exchange import FakeExchange

        fx = FakeExchange()
        monkeypatch.setattr(Tensor, "__dlpack_c_exchange_api__", fx.capsule, raising=False)
    return which


@pytest.fixture
def torch(monkeypatch):
    return make_torch(monkeypatch)


@pytest.fixture
def cupy(monkeypatch):
    return _install_cupy(monkeypatch)


@pytest.fixture
def general(monkeypatch) -> list:
    """The general path's calls (review 60's counter): a fast call adds nothing."""
    calls: list = []
    original = BoundProgram._call

    def counting(self, args, out, stream):
        calls.append((self.name, out is not None, stream))
        return original(self, args, out, stream)

    monkeypatch.setattr(BoundProgram, "_call", counting)
    return calls


@pytest.fixture
def fake2(monkeypatch):
    """The fake driver with sumdiff's kernel ((s, d) = (x + y, x - y))."""
    return install(monkeypatch, FakeDriver(kernels={"sumdiff": ("QQQQI", _sumdiff_impl)}))


def _f32(torch, values: list) -> Tensor:
    return Tensor(values, torch.float32)


def _warm(prog, make) -> None:
    for _ in range(2):  # the general path binds, the second call builds the fast path
        call_program(prog, make([1.0, 2.0]), make([3.0, 5.0]))


# ---- finding 1: out= as a tuple subclass -----------------------------------------------------
Pair = collections.namedtuple("Pair", "s d")


@pytest.mark.parametrize("path", ["C", "C-dlpack", "closure"], indirect=True)
def test_an_out_namedtuple_gets_the_general_paths_plain_tuple(fake2, torch, path,
                                                              general) -> None:
    """``out=Pair(s, d)`` (a namedtuple) for a program of two outputs. The general path reads
    it as a sequence and returns ``tuple(results)``, a plain tuple; the closure hands it over
    (``out.__class__ is tuple``). FastCall's ``check_out`` tests ``PyTuple_Check``, so it
    launches the call itself and returns the namedtuple object given: the answer's type
    depends on the launch path and on whether the call was the first. Fixed in session 57:
    ``PyTuple_CheckExact(out)`` in ``check_out`` (_fastcall.c), matching the closures."""
    prog = sumdiff()
    make = lambda v: _f32(torch, v)  # noqa: E731
    x, y, s, d = make([1.0, 2.0]), make([3.0, 5.0]), make([0.0, 0.0]), make([0.0, 0.0])
    first = call_program(prog, x, y, out=Pair(s, d))  # the general path's answer
    assert type(first) is tuple and first == (s, d)
    _warm(prog, make)
    got = call_program(prog, x, y, out=Pair(s, d))
    assert s.values() == [4.0, 7.0] and d.values() == [-2.0, -3.0]
    assert type(got) is tuple, f"{type(got).__name__} on the {path} path"


# ---- finding 2: reads_elsewhere's order reaches the file -------------------------------------
_SAVE_WITH_A_SET = """
import hashlib, sys
import kernelpack as kp
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)
s = KernelSummary("sd", (Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("n",)),
                         Tensor("s", kp.f32, ("n",), role="out"),
                         Scalar("n32", kp.u32, value="n")),
                  (Variant((Launch("k", "m", (kp.cdiv("n", 128),), (128,),
                                   (Arg.buffer("x"), Arg.buffer("y"), Arg.buffer("s"),
                                    Arg.scalar("n32")),
                                   reads_elsewhere={"x", "y", "s"}),)),))
img = Image("cubin", "sm_90", b"\\x7fELF-fake", "fake", 13000)
data = kp.save([Compiled(s, (Module("m", ("k",), (img,)),))])
print(hashlib.sha256(data).hexdigest())
"""


def _digest_with_hash_seed(seed: int) -> str:
    env = dict(os.environ, PYTHONHASHSEED=str(seed), PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-c", _SAVE_WITH_A_SET], env=env, text=True,
                          capture_output=True, timeout=120, check=True)
    return done.stdout.strip()


def test_reads_elsewhere_given_as_a_set_saves_the_same_bytes_in_every_process() -> None:
    """The same program, ``reads_elsewhere={"x", "y", "s"}`` (a set: what the field means,
    and what ``kp.external``'s ``Iterable[str]`` takes), saved in two processes whose hash
    seeds order the set differently (0 and 1 here: ('y', 'x', 's') and ('x', 's', 'y')):
    DESIGN.md's "the same compiled input gives the same artifact, byte for byte" fails, so
    two machines building one external make two artifacts (kp.Cache.external keys the set
    sorted, so both are filed under one key). Suggested fix: ``Launch._check_reads_elsewhere``
    stores ``tuple(sorted(names))`` (the field is a set of names; equal Launches then compare
    equal too), or refuses a set/frozenset with a TypeError naming the field."""
    assert _digest_with_hash_seed(0) == _digest_with_hash_seed(1)


# ---- stream= on the fast paths: errors as the general path's ---------------------------------
class _TorchStream:
    """A torch stream object: its raw handle and its device."""

    def __init__(self, handle: object, device: int) -> None:
        self.cuda_stream, self.device_index = handle, device


class _Proto:
    """An object of the CUDA stream protocol giving no (version, handle) pair."""

    def __cuda_stream__(self):
        return None


def _bad_streams() -> dict:
    import numpy

    return {"negative": -1, "2**64": 1 << 64, "bool": True, "float": 1.5, "str": "s",
            "numpy float": numpy.float64(3.0), "broken protocol": _Proto(),
            "device 1": _TorchStream(0x99, 1), "device 0, bad handle": _TorchStream(-3, 0)}


def _bad_streams_of_another_device() -> dict:
    return {"device 1, bad handle": _TorchStream(1 << 64, 1),
            "device 1, float handle": _TorchStream(2.5, 1)}


def _error(fn) -> tuple:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return None


def _axpby_fake(monkeypatch):
    from test_launch_fake import _axpby_impl

    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}))


def _compare_stream_errors(monkeypatch, torch, with_out: bool, streams: dict,
                           make=None) -> None:
    """Each of ``streams`` on a warm fast path and on the general path (BoundProgram's
    ``__call__``): the same exception class and words; nothing launched. ``make(values)``:
    an array (default: a stand-in float32 torch tensor)."""
    from test_launch_fake import axpby

    make = make or (lambda values: _f32(torch, values))
    fake = _axpby_fake(monkeypatch)
    prog = axpby()
    x, y = make([1.0, 2.0]), make([3.0, 5.0])
    for _ in range(2):
        call_program(prog, x, y, 1.0)
    bp = bind(prog)
    launched = sum(1 for c in fake.calls if c[0] == "cuLaunchKernel")
    for what, stream in streams.items():
        out = make([0.0, 0.0]) if with_out else None
        fast = _error(lambda out=out, stream=stream: call_program(prog, x, y, 1.0, out=out,
                                                                  stream=stream))
        slow = _error(lambda out=out, stream=stream: bp.__call__((x, y, 1.0), out, stream))
        assert fast is not None and fast == slow, (what, fast, slow)
    assert sum(1 for c in fake.calls if c[0] == "cuLaunchKernel") == launched


@pytest.mark.parametrize("with_out", [False, True])
def test_a_bad_stream_is_the_general_paths_error_on_every_torch_path(
        monkeypatch, torch, path, with_out) -> None:
    """A call whose arrays fit the fast path but whose ``stream=`` is wrong: every fast path
    (since a24e3e3 also without ``out=``, which reads the handle in FastCall before any
    output is made) raises what the general path raises for the same call: class and words.
    The general path reads the handle first (``stream_handle``) and checks its device after
    the planner; FastCall asks ``hooks.stream_handle``, which checks the device first: the
    two orders differ only for a stream object both of another device and with a bad
    handle, covered here."""
    _compare_stream_errors(monkeypatch, torch, with_out, _bad_streams())


@pytest.mark.parametrize("with_out", [False, True])
def test_a_bad_stream_is_the_general_paths_error_on_every_cupy_path(
        monkeypatch, cupy, path, with_out) -> None:
    """The same for CuPy arrays (02ccc3e/66410c9: CuPy's ``stream=`` calls without ``out=``
    now reach fast_cupy's ``handle_for`` and FastCall's CuPy flavour); a CuPy stream says its
    device as ``device_id``."""
    import types

    streams = dict(_bad_streams())
    streams["cupy device 1"] = types.SimpleNamespace(ptr=0x99, device_id=1)
    _compare_stream_errors(monkeypatch, None, with_out, streams, NDArray)


@pytest.mark.parametrize("path", ["C", "C-dlpack", "closure"], indirect=True)
@pytest.mark.parametrize("with_out", [False, True])
def test_a_stream_of_another_device_with_a_bad_handle_is_the_general_paths_error(
        monkeypatch, torch, path, with_out) -> None:
    """Minor (finding 3). A stream object saying device 1 (the arrays are on 0) whose handle
    is not one (2**64, a float): the general path's ``stream_handle`` runs first and raises
    ValueError/TypeError naming ``stream=``; FastCall's ``hooks.stream_handle`` runs
    ``check_stream_device`` first and raises the LaunchError "a stream of device 1". The
    closure hands the call over. Since a24e3e3 calls without ``out=`` reach it too (before,
    only ``out=`` calls did: the order is older than fc9220a). Fixed in session 57:
    ``fast_native.Hooks.stream_handle`` reads ``self._stream_handle(stream)`` first, then
    ``check_stream_device``."""
    _compare_stream_errors(monkeypatch, torch, with_out, _bad_streams_of_another_device())


# ---- out= tuples on the fast paths against the general path: a differential sweep ---------
def _load(addr: int, n: int) -> list:
    import ctypes
    import struct

    return list(struct.unpack(f"<{n}f", ctypes.string_at(addr, 4 * n)))


def _store(addr: int, values: list) -> None:
    import ctypes
    import struct

    ctypes.memmove(addr, struct.pack(f"<{len(values)}f", *values), 4 * len(values))


def _loads_first(grid, block, shmem, v) -> None:
    """s = x + y, d = x - y, every load before any store (stores_after_loads)."""
    x, y, s, d, n = v
    xs, ys = _load(x, n), _load(y, n)
    _store(s, [p + q for p, q in zip(xs, ys)])
    _store(d, [p - q for p, q in zip(xs, ys)])


def _s_then_d(grid, block, shmem, v) -> None:
    """The same sums, but all of s stored before x and y are read again for d (a kernel
    that stores two arrays without loading first: in place over an input needs a copy)."""
    x, y, s, d, n = v
    _store(s, [p + q for p, q in zip(_load(x, n), _load(y, n))])
    _store(d, [p - q for p, q in zip(_load(x, n), _load(y, n))])


def _reversed(grid, block, shmem, v) -> None:
    """s[i] = x[n-1-i] + y[i], d[i] = x[i] - y[i], thread i after thread i-1, each thread
    loading before it stores (stores_after_loads) but reading x at another element than the
    ones it stores (reads_elsewhere x)."""
    x, y, s, d, n = v
    for i in range(n):
        xr, xi, yi = _load(x + 4 * (n - 1 - i), 1)[0], _load(x + 4 * i, 1)[0], \
            _load(y + 4 * i, 1)[0]
        _store(s + 4 * i, [xr + yi])
        _store(d + 4 * i, [xi - yi])


_KERNELS = {"loads_first": ("QQQQI", _loads_first), "s_then_d": ("QQQQI", _s_then_d),
            "reversed": ("QQQQI", _reversed)}


def _two_outputs(kernel: str, stores_after_loads: bool, elsewhere: tuple = ()):
    import kernelpack as kp
    from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                    Tensor as TensorSpec, Variant)

    s = KernelSummary(kernel, (TensorSpec("x", kp.f32, ("n",)), TensorSpec("y", kp.f32, ("n",)),
                               TensorSpec("s", kp.f32, ("n",), role="out"),
                               TensorSpec("d", kp.f32, ("n",), role="out"),
                               Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch(kernel, "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("y"), Arg.buffer("s"),
                                        Arg.buffer("d"), Arg.scalar("n32")),
                                       stores_after_loads=stores_after_loads,
                                       reads_elsewhere=elsewhere),)),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-" + kernel.encode(), "fake", 13000)
    return Compiled(s, (Module("m", (kernel,), (img,)),))


def _region(torch, base: Tensor, offset: int, n: int) -> Tensor:
    """A stand-in float32 tensor of ``n`` elements over ``base``'s memory from byte
    ``offset`` (views that share memory with each other in every way)."""
    import ctypes

    t = Tensor([0.0] * n, torch.float32, shape=(n,))
    t._buf = (ctypes.c_char * (4 * n)).from_address(base.data_ptr() + offset)
    t.base = base
    return t


def _sweep_out_tuples(monkeypatch, program: str, path: str, general: list, region,
                      base_ptr: int, stream: object = None) -> None:
    """The body of the out= tuple sweeps: ``region(offset, n)`` makes an array over the
    shared buffer at ``base_ptr`` (24 float32) from byte ``offset``."""
    import ctypes
    import random

    install(monkeypatch, FakeDriver(kernels=_KERNELS))
    prog = {"loads_first": lambda: _two_outputs("loads_first", True),
            "s_then_d": lambda: _two_outputs("s_then_d", False),
            "reversed": lambda: _two_outputs("reversed", True, ("x",))}[program]()
    n, size = 4, 24 * 4
    for _ in range(2):
        call_program(prog, region(64, n), region(80, n))
    bp = bind(prog)
    fast_obj = getattr(bp.call, "__self__", None)
    rng = random.Random(72)
    offsets = [0, 4, 8, 16, 32, 48, 64, 80]
    taken = 0
    for _ in range(150):
        x, y, s, d = (region(rng.choice(offsets), n) for _ in range(4))
        if rng.random() < 0.3:
            s = rng.choice([x, y])
        if rng.random() < 0.3:
            d = rng.choice([x, y, s])
        start = [float(rng.randint(-9, 9)) for _ in range(24)]
        _store(base_ptr, start)
        want = _error(lambda x=x, y=y, s=s, d=d: bp.__call__((x, y), (s, d), stream))
        want_mem = ctypes.string_at(base_ptr, size)
        _store(base_ptr, start)
        before = len(general)
        got = _error(lambda x=x, y=y, s=s, d=d: call_program(prog, x, y, out=(s, d),
                                                             stream=stream))
        got_mem = ctypes.string_at(base_ptr, size)
        taken += len(general) == before
        where = [a.data_ptr() - base_ptr if hasattr(a, "data_ptr") else a.data.ptr - base_ptr
                 for a in (x, y, s, d)]
        assert (got, got_mem) == (want, want_mem), where
    assert taken >= 5, taken  # the fast path launched a fair share itself (21 to 79 here)
    if fast_obj is not None and type(fast_obj).__name__ == "FastCall":
        assert fast_obj.fast_calls >= taken


@pytest.mark.parametrize("stream", [None, 0x77])
@pytest.mark.parametrize("program", ["loads_first", "s_then_d", "reversed"])
def test_out_tuples_over_shared_memory_answer_as_the_general_path(
        monkeypatch, torch, path, program, general, stream) -> None:
    """Random calls ``prog(x, y, out=(s, d))`` whose four arrays are regions of one buffer
    (the same region, partial overlaps, disjoint), each run twice from the same memory: by
    the general path (``BoundProgram.__call__``) and by the call the fast path gets
    (346febd's ``outs_conflict`` / C ``check_out``, fde7911's ``stores_after_loads``,
    ce6d73e's ``reads_elsewhere``). Both must leave the same bytes and raise the same error
    (class and words); the host "kernels" answer differently when run in place without the
    copy the general path makes, so a fast path launching what it should hand over shows.
    Right on every torch path (150 calls per program; 21-79 launched by the fast path),
    on the current stream and with ``stream=`` (FastCall reads the handle before ``out=``
    since 66410c9)."""
    base = Tensor([0.0] * 24, torch.float32, shape=(24,))
    _sweep_out_tuples(monkeypatch, program, path, general,
                      lambda offset, n: _region(torch, base, offset, n), base.data_ptr(),
                      stream)


@pytest.mark.parametrize("program", ["loads_first", "s_then_d", "reversed"])
def test_cupy_out_tuples_over_shared_memory_answer_as_the_general_path(
        monkeypatch, cupy, path, program, general) -> None:
    """The same sweep with the stand-in CuPy arrays (fast_cupy's closure and FastCall's CuPy
    flavour; "C-dlpack" runs CuPy's C path too, the exchange API being torch's)."""
    import types

    base = NDArray([0.0] * 24)
    ptr = base.data.ptr

    def region(offset: int, n: int) -> NDArray:
        a = NDArray((n,), "float32", memptr=types.SimpleNamespace(ptr=ptr + offset))
        a.flags, a.base = types.SimpleNamespace(c_contiguous=True), base
        return a

    _sweep_out_tuples(monkeypatch, program, path, general, region, ptr)


def _inout_reversed(grid, block, shmem, v) -> None:
    """y[i] += x[n-1-i], thread i after thread i-1 (reads_elsewhere x)."""
    x, y, n = v
    for i in range(n):
        _store(y + 4 * i, [_load(y + 4 * i, 1)[0] + _load(x + 4 * (n - 1 - i), 1)[0]])


def _inout_program(elsewhere: tuple):
    import kernelpack as kp
    from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                    Tensor as TensorSpec, Variant)

    s = KernelSummary("inout_rev", (TensorSpec("x", kp.f32, ("n",)),
                                    TensorSpec("y", kp.f32, ("n",), role="inout"),
                                    Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("inout_rev", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("y"), Arg.scalar("n32")),
                                       reads_elsewhere=elsewhere),)),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-inout", "fake", 13000)
    return Compiled(s, (Module("m", ("inout_rev",), (img,)),))


def test_an_inout_argument_over_an_input_read_elsewhere_answers_as_the_general_path(
        monkeypatch, torch, path, general) -> None:
    """``y += reversed(x)`` (``y`` role inout, the kernel reading ``x`` elsewhere): with ``y``
    the very same memory as ``x`` the general path reads ``x`` from a copy (in_place's fourth
    rule through ``written_pairs``); each fast path must hand such a call over and launch the
    others itself, leaving the bytes the general path leaves."""
    import ctypes
    import random

    install(monkeypatch, FakeDriver(kernels={"inout_rev": ("QQI", _inout_reversed)}))
    prog = _inout_program(("x",))
    n = 4
    base = Tensor([0.0] * 24, torch.float32, shape=(24,))
    for _ in range(2):
        call_program(prog, _region(torch, base, 0, n), _region(torch, base, 32, n))
    bp = bind(prog)
    rng = random.Random(7)
    taken = 0
    for _ in range(120):
        x, y = (_region(torch, base, rng.choice([0, 4, 8, 16, 32, 48]), n) for _ in range(2))
        if rng.random() < 0.3:
            y = x
        start = [float(rng.randint(-9, 9)) for _ in range(24)]
        _store(base.data_ptr(), start)
        want = _error(lambda x=x, y=y: bp.__call__((x, y), None, None))
        want_mem = ctypes.string_at(base.data_ptr(), 96)
        _store(base.data_ptr(), start)
        before = len(general)
        got = _error(lambda x=x, y=y: call_program(prog, x, y))
        assert (got, ctypes.string_at(base.data_ptr(), 96)) == (want, want_mem)
        taken += len(general) == before
    assert taken >= 20, taken


# ---- finding 4: an interrupt as CuPy's stream-ordered scratch is taken leaks it ----------
def _interrupted_ordered_scratch(monkeypatch) -> list:
    """``fast_cupy._ordered_scratch(cupy, 64, 5, "prog")`` once per instruction boundary of
    fast_cupy.py's and driver.py's code it runs, a KeyboardInterrupt raised there (review
    62's sweep: a superset of where CPython raises a SIGINT, which includes every CALL's end
    and every function's RESUME). Per boundary ``(file, line, allocations, frees)``, until a
    call runs through uninterrupted (the driver initialized and the stream cached first, so
    the sweep stays in the scratch's own code)."""
    import gc

    from kernelpack.runtime import driver, fast_cupy
    from kernelpack.runtime.execute import cu_stream

    fake = install(monkeypatch, FakeDriver(kernels={}))
    cupy = _install_cupy(monkeypatch)
    cu_stream(5)
    fast_cupy._ordered_scratch(cupy, 64, 5, "prog")
    gc.collect()
    files = {fast_cupy.__file__: "fast_cupy.py", driver.__file__: "driver.py"}
    seen: list = []
    k = 1
    while k < 2000:
        c0 = len(fake.calls)
        at, got = run_interrupted(lambda: fast_cupy._ordered_scratch(cupy, 64, 5, "prog"),
                                  files, k)
        del got
        gc.collect()
        if at is None:
            return seen
        calls = fake.calls[c0:]
        allocs = sum(1 for c in calls if c[0] == "cuMemAllocAsync")
        frees = sum(1 for c in calls if c[0] == "cuMemFreeAsync")
        seen.append((*at, allocs, frees))
        k += 1
    raise AssertionError("the sweep did not end")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupt_while_cupy_scratch_is_taken_frees_it_once(monkeypatch) -> None:
    """Review 62 fixed this leak for torch (``block.held.extend(map(raw_alloc, ...))``: no
    Python code runs between the allocator's return and the store) and made CuPy's owner
    first against the double free, but ``_ordered_scratch`` still does ``ptr =
    int(_drv.check(drv.cuMemAllocAsync(size, cs), ...))`` and then
    ``owner.held.append(ptr)``: an interrupt at any boundary in between (the allocation's
    CALL end, ``check``'s RESUME, ...) leaves a stream-ordered allocation no one frees.
    The sweep finds 39 such boundaries (fast_cupy.py lines 51-53, driver.check), each one
    allocation and no free; no boundary frees twice. Suggested fix: store the driver's
    whole answer in the owner in one C call (``owner.results.extend(map(
    drv.cuMemAllocAsync, (size,), (cs,)))``), have ``_PoolBlock``'s release free the
    pointer of each successful answer, then ``check`` the stored answer. The general
    path's ``execute._temporary`` (``ptr = int(_drv.check(drv.cuMemAllocAsync(...)))`` then
    ``ordered.append(ptr)``, older than fc9220a) has the same window."""
    seen = _interrupted_ordered_scratch(monkeypatch)
    assert len(seen) > 20  # (the sweep ran)
    assert [s for s in seen if s[3] > s[2]] == []  # nothing freed twice (review 62's fix)
    assert [s for s in seen if s[2] != s[3]] == []


# ---- GPU only (the lead runs these on an H200; they skip here) -------------------------------
def _gpu_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


@pytest.fixture(scope="module")
def gpu_pack():
    """A column standard deviation (scratch on every shape) and a two-output pointwise
    program, compiled for the device (after the skip: nothing compiled without a GPU)."""
    import ctypes

    import kernelpack as kp
    import runtime_kernels

    try:  # (asked first: the fake driver's tests above leave the runtime's driver state odd)
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        pytest.skip(f"no CUDA driver: {exc}")
    runtime_kernels.gpu_count_or_skip()

    T = kp.Tensor

    @kp.fusion
    def r72_colstd(x: T[kp.f32, "a", "b"]):
        c = x - x.mean(axis=0, keepdims=True)
        return kp.sqrt((c * c).mean(axis=0))

    @kp.fusion
    def r72_sumdiff(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
        return x + y, x - y

    return kp.load(kp.save([kp.compile(f, targets=["sm_80", "sm_90", "ptx"])
                            for f in (r72_colstd, r72_sumdiff)]))


@pytest.mark.gpu
def test_gpu_an_out_namedtuple_gets_a_plain_tuple(gpu_pack) -> None:
    """Finding 1 on a real GPU: with the C extension built (the H200 default) the warm call
    returned the namedtuple it was given, the first (general) call a plain tuple (fixed in
    session 57)."""
    torch = _gpu_torch()
    prog = gpu_pack["r72_sumdiff"]
    x, y = torch.arange(5.0, device="cuda"), torch.ones(5, device="cuda")
    s, d = torch.empty_like(x), torch.empty_like(x)
    kinds = [type(prog(x, y, out=Pair(s, d))) for _ in range(3)]
    torch.cuda.synchronize()
    torch.testing.assert_close(s, x + y)
    torch.testing.assert_close(d, x - y)
    assert kinds == [tuple, tuple, tuple], kinds


@pytest.mark.gpu
def test_gpu_graph_capture_with_an_explicit_stream_and_scratch(gpu_pack) -> None:
    """Since 7c35d2c/3240736 a call with scratch and ``stream=`` takes the fast path, its
    scratch a block of torch's caching allocator taken with ``raw_alloc(nbytes, handle)``
    (``TorchAdapter.scratch``), whose docstring says a captured stream gets its graph's
    private pool "either way". Captured on ``stream=`` the capture stream, with ``out=`` and
    without (a24e3e3: that output from the stream's pool), two calls in the graph (so the
    second may reuse the first's block), then replayed on new data: both right."""
    torch = _gpu_torch()
    prog = gpu_pack["r72_colstd"]
    x = torch.randn(2000, 256, device="cuda")
    z = torch.empty(256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # bound, loaded, fast path built outside the capture
            prog(x, out=z, stream=s)
            prog(x, stream=s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        prog(x, out=z, stream=s)
        y = prog(x * 2, stream=s)
    for k in range(3):
        x.copy_(torch.randn(2000, 256, device="cuda") * (k + 1) + k)
        z.zero_()
        g.replay()
        torch.cuda.synchronize()
        want = x.double().std(0, unbiased=False).float()
        torch.testing.assert_close(z, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(y, 2 * want, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_cupy_stream_outputs_leave_cupys_with_block_alone(gpu_pack) -> None:
    """``CupyAdapter.array_on`` (02ccc3e/edeaea7) makes ``stream=``'s stream current with
    ``use()`` and puts the previous one back with ``before.use()``. Inside ``with s1:`` a
    call with ``stream=s2`` and no ``out=`` (fast path after the first) must leave ``s1``
    current, and leaving the ``with`` must give back the null stream, call after call."""
    cp = pytest.importorskip("cupy")
    prog = gpu_pack["r72_sumdiff"]
    x, y = cp.arange(5, dtype=cp.float32), cp.ones(5, dtype=cp.float32)
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    for _ in range(3):
        with s1:
            a, b = prog(x, y, stream=s2)
            assert cp.cuda.get_current_stream() == s1
        assert cp.cuda.get_current_stream() == cp.cuda.Stream.null
        s2.synchronize()
        cp.testing.assert_allclose(a, x + y)
        cp.testing.assert_allclose(b, x - y)
