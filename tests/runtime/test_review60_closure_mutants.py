"""Review 60: mutation testing of the Python fast paths (the torch and CuPy closures of
``runtime/fast_torch.py`` and ``runtime/fast_cupy.py``, ``KERNELPACK_NATIVE_LAUNCH=0``) and of
the parts of ``runtime/fastpath.py`` they share with the C path, on CPU with the stand-in
torch/CuPy of test_fastpath_fake.py and the fake driver.

The suite mostly checked *results*, which the general path gives too: on the closure path a
mutant that sent calls to the general path for nothing, or that kept a key too coarse, went
unseen. The ``general`` fixture here counts the general path's calls (``BoundProgram._call``),
so a test can say "this call took the fast path" on the closure as ``fast_calls`` says it on
the C path.

Mutants (209, one site each, listed with outcomes in /tmp/r60/REPORT.md of review 60; T: the
torch closure, C: the CuPy closure, F: fastpath.py). The tests below kill, of those the
suite let live or that the suite run did not reach:

- T02 too_many_arguments; T04 first_tensors_dtype; T13 T18 scalars_needing_conversion;
  T15 T16 F66 F68 float32_overflow; T20 T21 integer_scalars_at_their_range_ends;
  T22 T23 F08 F65 F69 F73 only_the_symbols (some also killed by the suite);
  T33-T37 F16 F17 outputs_are_allocated; T17 T38 float64_scalars_and_programs_without_outputs;
  T40 F71 a_single_out_is_checked; T48 T49 out_as_a_one_tuple; T52 T54 T57 T60
  each_out_array_is_checked; T63 F84 a_stream_of_another_device; T25 host_tensors;
  T39 outputs_made_for_a_call_launch_on_their_devices_current_stream; T61
  several_real_outs_are_not_asked; T65 T66 scratch_buffers_apart;
- C01 cupy_stream_without_out (since session 44: allocates from that stream's arena);
  C02 C05 C07 C08 C13 C14 C15 C38 C53 C54 cupy_argument_checks_beyond_the_first; C04 C09 C52 cupy_dtypes_that_are_equal;
  C06 C12 C30 misaligned_cupy_arrays; C11 C16 cupy_inputs_checks_and_keys; C21-C24 C35-C37
  C39-C41 C48-C50 cupy_outputs_allocated_and_checked_per_output; C26-C28
  cupy_single_out_checks; C32 C34 C44 cupy_out_tuple_and_stream_forms; C45 C51
  cupy_scratch_buffers_apart; C47 a_complex_cupy_array_needs_only_its_parts_alignment;
  C33 (a short out= tuple: the launch writes through a NULL pointer, the process dies);
- F01 a_repeated_launch; F05 a_program_without_tensor_inputs; F12 an_empty_grid; F13 F14
  48_kib_of_shared_memory; F45 F47 F52 F55 F81 empty_arrays_inside_others; F72
  torch_path_falls_back_to_cupys; F76 F77 (crash or wrong answer in several tests); F33
  a_failed_launch_of_several.

Equivalent (not killable through the closures): T67 C46 F28 F32 (``fire`` never returns
False, nor does ``pack`` raise, after the closures' checks: ints and float32 overflow are
checked before, computed values by the planner, and an empty grid packs nothing); F02 (a
non-simple launch needs a loop symbol, which needs ``count``: F01's check refuses it first);
F11 (a variant reads only its own computed values; the padding is never read); F19
(``fire_all`` does for one launch what the single-launch branch does); F59 (a written pair
checked twice; ``conflicts(..., True)`` is symmetric); F67 (a value slot's struct code is
its scalar's in every variant); F70 (``keyed`` holds symbol names only); F78 (``fills`` is
empty only when nothing is computed, and then ``vals[fill_from:] = []`` changes nothing);
F06 F07 (float16 packs with struct 'e' as the general path converts; bfloat16's 'H' and
bool's '?' fall back or agree); F09 (no input found that makes the planner raise a bare
ArithmeticError). F24 F35 F36 (the default-stream context checks of ``fire``/``relaunch``:
handle 2, a relaunch when the context was not remembered, the pop after a pushed relaunch)
are killed by tests/runtime/test_fast_context.py (session 41). The 20 mutants the review's
suite run did not reach before its time box were run afterwards (session 41): 18 killed by
the suite (C29 C31 C42 C43 F53 F54 F56-F58 F60-F64 F74 F75 F80 F82), F79 (``scratch_layout``
answering ``(0, ())`` for no scratch) and F83 (a failed relaunch ignored) by two new tests in
test_fast_context.py.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.launcher import BoundProgram, bind
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Scratch, Tensor as TensorSpec, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import (NDArray, Tensor, cupy, install_external_stream,  # noqa: E402,F401
                                select_path, torch)
from test_launch_fake import _axpby_impl, axpby  # noqa: E402
from test_lazy_views import _copy8_impl, copy_c64  # noqa: E402
from test_several_outs_fast import _sumdiff_impl, sumdiff  # noqa: E402


@pytest.fixture(autouse=True)
def launch_path(monkeypatch) -> str:
    """Every test here runs on the closures (the mutated code)."""
    return select_path("closure", monkeypatch)


@pytest.fixture
def general(monkeypatch) -> list:
    """The general path's calls, one ``(program name, out given, stream)`` each: a call that
    the fast path launched itself adds nothing."""
    calls: list = []
    original = BoundProgram._call

    def counting(self: Any, args: Any, out: Any, stream: Any) -> Any:
        calls.append((self.name, out is not None, stream))
        return original(self, args, out, stream)

    monkeypatch.setattr(BoundProgram, "_call", counting)
    return calls


# ---- programs and their host "kernels" -----------------------------------------------------
def _f32(addr: int, n: int) -> list:
    return list(struct.unpack(f"<{n}f", ctypes.string_at(addr, 4 * n)))


def _put(addr: int, fmt: str, values: list) -> None:
    ctypes.memmove(addr, struct.pack(f"<{len(values)}{fmt}", *values),
                   struct.calcsize(f"<{len(values)}{fmt}"))


def _mixed_impl(grid, block, shmem, v) -> None:
    x, w, z, u, k, c, a, n, m = v
    xs, ws = _f32(x, n), _f32(w, m)
    _put(z, "f", [a * p for p in xs])
    _put(u, "f", [q + 1.0 for q in ws])
    _put(k, "i", [int(p) for p in xs])
    _put(c, "i", [n, m])


def _axpy_impl(grid, block, shmem, v) -> None:
    x, y, a, n = v
    _put(y, "f", [a * p + q for p, q in zip(_f32(x, n), _f32(y, n))])


def _scale_impl(grid, block, shmem, v) -> None:
    x, z, a, n = v
    _put(z, "f", [a * p for p in _f32(x, n)])


def _trunc_impl(grid, block, shmem, v) -> None:
    x, k, n = v
    _put(k, "i", [int(p) for p in _f32(x, n)])


def _through_impl(grid, block, shmem, v) -> None:
    x, s, t, z, n = v
    ctypes.memmove(s, x, 4 * n)
    _put(t, "f", [2 * p for p in _f32(x, n)])
    _put(z, "f", [p + q for p, q in zip(_f32(s, n), _f32(t, n))])


def _bump_impl(grid, block, shmem, v) -> None:
    x, n = v
    _put(x, "f", [p + 1.0 for p in _f32(x, n)])


def _iota_impl(grid, block, shmem, v) -> None:
    z, n = v
    _put(z, "f", [float(i) for i in range(n)])


def _copyn_impl(grid, block, shmem, v) -> None:
    src, dst, n = v
    ctypes.memmove(dst, src, 4 * n)


def _keyed_impl(grid, block, shmem, v) -> None:
    x, z, seed, _k, n = v
    _put(z, "f", [p + seed for p in _f32(x, n)])


KERNELS = {"axpby": ("QQQfI", _axpby_impl), "sumdiff": ("QQQQI", _sumdiff_impl),
           "mixed": ("QQQQQQfII", _mixed_impl), "scale": ("QQdI", _scale_impl),
           "axpy": ("QQfI", _axpy_impl), "stage": ("Q", lambda *a: None),
           "copy8": ("QQI", _copy8_impl), "through": ("QQQQI", _through_impl),
           "bump": ("QI", _bump_impl), "iota": ("Qi", _iota_impl),
           "copyn": ("QQI", _copyn_impl),
           "trunc": ("QQI", _trunc_impl), "keyed": ("QQiiI", _keyed_impl)}


def _compiled(summary: KernelSummary, kernel: str) -> Compiled:
    img = Image("cubin", "sm_90", b"\x7fELF-fake-" + kernel.encode(), "fake", 13000)
    return Compiled(summary, (Module("m", (kernel,), (img,)),))


def mixed() -> Compiled:
    """A float scalar first, two tensors of different shapes and four outputs: ``z`` like
    ``x``, ``u`` like ``w`` (the second tensor), ``k`` shaped like ``x`` in another dtype and
    ``c`` like no input, so each output's own shape, dtype and "like" input matter."""
    s = KernelSummary("mixed", (Scalar("a", kp.f32), TensorSpec("x", kp.f32, ("n",)),
                                TensorSpec("w", kp.f32, ("m",)),
                                TensorSpec("z", kp.f32, ("n",), role="out"),
                                TensorSpec("u", kp.f32, ("m",), role="out"),
                                TensorSpec("k", kp.i32, ("n",), role="out"),
                                TensorSpec("c", kp.i32, (2,), role="out"),
                                Scalar("n32", kp.u32, value="n"),
                                Scalar("m32", kp.u32, value="m")),
                      (Variant((Launch("mixed", "m", (1,), (1,),
                                       tuple(Arg.buffer(b) for b in "xwzukc")
                                       + (Arg.scalar("a"), Arg.scalar("n32"),
                                          Arg.scalar("m32"))),)),))
    return _compiled(s, "mixed")


def scale() -> Compiled:
    """z = a * x with a float64 scalar first: the output is allocated like ``args[1]``."""
    s = KernelSummary("scale", (Scalar("a", kp.f64), TensorSpec("x", kp.f32, ("n",)),
                                TensorSpec("z", kp.f32, ("n",), role="out"),
                                Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("scale", "m", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("z"), Arg.scalar("a"),
                                        Arg.scalar("n32"))),)),))
    return _compiled(s, "scale")


def trunc() -> Compiled:
    """k = int(x): one output shaped like the input in another dtype (allocated, not "like")."""
    s = KernelSummary("trunc", (TensorSpec("x", kp.f32, ("n",)),
                                TensorSpec("k", kp.i32, ("n",), role="out"),
                                Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("trunc", "m", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("k"),
                                        Arg.scalar("n32"))),)),))
    return _compiled(s, "trunc")


def keyed() -> Compiled:
    """z = x + seed on a grid of (2, 1, ``k``) blocks: ``seed`` (before ``k``) is read by the
    kernel only, so it must not key launch entries; ``k`` is read by the grid, so it must."""
    s = KernelSummary("keyed", (TensorSpec("x", kp.f32, ("n",)),
                                TensorSpec("z", kp.f32, ("n",), role="out"),
                                Scalar("seed", kp.i32), Scalar("k", kp.i32),
                                Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("keyed", "m", (2, 1, "k"), (1,),
                                       (Arg.buffer("x"), Arg.buffer("z"), Arg.scalar("seed"),
                                        Arg.scalar("k"), Arg.scalar("n32"))),)),))
    return _compiled(s, "keyed")


def staged() -> Compiled:
    """A kernel taking ``4 * n`` bytes of dynamic shared memory (test_review10's)."""
    s = KernelSummary("staged", (TensorSpec("x", kp.f32, ("n",), role="inout"),),
                      (Variant((Launch("stage", "m", (1,), (1,), (Arg.buffer("x"),),
                                       shared_mem=kp.sym("n") * 4),)),))
    return _compiled(s, "stage")


def through() -> Compiled:
    """z = 3x through two scratch buffers of ``n`` floats, s = x and t = 2x (z = 4x when
    they share memory; no scratch at all when ``n`` is 0)."""
    s = KernelSummary("through", (TensorSpec("x", kp.f32, ("n",)),
                                  TensorSpec("z", kp.f32, ("n",), role="out")),
                      (Variant((Launch("through", "m", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("s"), Arg.buffer("t"),
                                        Arg.buffer("z"), Arg.of(kp.sym("n"), kp.u32))),),
                               (Scratch("s", kp.f32, ("n",)), Scratch("t", kp.f32, ("n",)))),))
    return _compiled(s, "through")


def iota() -> Compiled:
    """z = 0, 1, ..., n - 1 from the scalar ``n`` alone: no tensor input."""
    s = KernelSummary("iota", (Scalar("n", kp.i32), TensorSpec("z", kp.f32, ("n",), role="out")),
                      (Variant((Launch("iota", "m", (1,), (1,),
                                       (Arg.buffer("z"), Arg.scalar("n"))),)),))
    return _compiled(s, "iota")


def twice() -> Compiled:
    """z = x in two launches (x to z, then z onto itself)."""
    def copy(src: str, dst: str) -> Launch:
        return Launch("copyn", "m", (1,), (1,), (Arg.buffer(src), Arg.buffer(dst),
                                                 Arg.of(kp.sym("n"), kp.u32)))

    s = KernelSummary("twice", (TensorSpec("x", kp.f32, ("n",)),
                                TensorSpec("z", kp.f32, ("n",), role="out")),
                      (Variant((copy("x", "z"), copy("z", "z"))),))
    return _compiled(s, "copyn")


def bumped() -> Compiled:
    """x += 1, three times: a repeated launch (the general path's)."""
    s = KernelSummary("bumped", (TensorSpec("x", kp.f32, ("n",), role="inout"),),
                      (Variant((Launch("bump", "m", (1,), (1,),
                                       (Arg.buffer("x"), Arg.of(kp.sym("n"), kp.u32)),
                                       count=3),)),))
    return _compiled(s, "bump")


def axpy() -> Compiled:
    """y += a * x: no output, ``y`` inout (a call returns None)."""
    s = KernelSummary("axpy", (TensorSpec("x", kp.f32, ("n",)),
                               TensorSpec("y", kp.f32, ("n",), role="inout"),
                               Scalar("a", kp.f32), Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("axpy", "m", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("y"), Arg.scalar("a"),
                                        Arg.scalar("n32"))),)),))
    return _compiled(s, "axpy")


@pytest.fixture
def fake(monkeypatch) -> FakeDriver:
    return install(monkeypatch, FakeDriver(kernels=KERNELS))


def _launches(fake: FakeDriver) -> list:
    """The fake driver's launches: ``(kernel, grid, block, shmem, stream, values)``."""
    return [c[1:] for c in fake.calls if c[0] == "cuLaunchKernel"]


def _f(torch: Any, values: list, **kw: Any) -> Tensor:
    return Tensor(values, torch.float32, **kw)


def _warm(prog: Compiled, *args: Any, **kw: Any) -> None:
    """Bind the program and build its fast path (a first call is the general path's)."""
    for _ in range(2):
        call_program(prog, *args, **kw)


# ---- the torch closure: arguments ------------------------------------------------------------
def test_too_many_arguments_are_the_general_paths_type_error(fake, torch, general) -> None:
    """T02: ``len(args) < n_in`` launched a call with an extra argument, ignoring it."""
    prog = axpby()
    x, y = _f(torch, [1.0, 2.0]), _f(torch, [1.0, 1.0])
    _warm(prog, x, y, 1.0)
    launched = len(_launches(fake))
    with pytest.raises(TypeError, match=r"axpby takes 3 inputs .* \(got 5\)"):
        bind(prog).call((x, y, 1.0, 2, 3), None, None)  # as call_program would pass them
    assert len(_launches(fake)) == launched


def test_the_first_tensors_dtype_is_checked(fake, torch) -> None:
    """T04: without the first tensor's dtype check an int32 ``x`` was launched as float32."""
    prog = axpby()
    x, y = _f(torch, [1.0, 2.0]), _f(torch, [1.0, 1.0])
    _warm(prog, x, y, 1.0)
    launched = len(_launches(fake))
    with pytest.raises(LaunchError, match="'x' has dtype int32, expected float32"):
        call_program(prog, Tensor([1, 2], torch.int32), y, 1.0)
    assert len(_launches(fake)) == launched


# ---- the torch closure: scalars ----------------------------------------------------------------
def test_scalars_needing_conversion_go_to_the_general_path(fake, torch, general) -> None:
    """T13 (float class check dropped), T18 (int class check dropped): an int for a float
    scalar and a bool for an int one need the general path's conversion (the module says so);
    the answer is the same, so only the general path's count shows which path ran."""
    prog, kprog = axpby(), keyed()
    x, y = _f(torch, [1.0, 2.0]), _f(torch, [1.0, 1.0])
    _warm(prog, x, y, 1.0)
    _warm(kprog, x, 0, 1)
    before = len(general)
    assert call_program(prog, x, y, 2.0).values() == [3.0, 5.0]
    assert call_program(kprog, x, 5, 1).values() == [6.0, 7.0]
    assert len(general) == before  # the fast path took both
    assert call_program(prog, x, y, 3).values() == [4.0, 7.0]
    assert len(general) == before + 1
    assert call_program(kprog, x, True, 1).values() == [2.0, 3.0]
    assert len(general) == before + 2


def test_float32_overflow_is_refused_from_its_very_boundary(fake, torch, general) -> None:
    """T15 (``FLOAT32_OVERFLOW < abs(v)``): FLOAT32_OVERFLOW itself rounds to infinity as a
    float32 (``struct`` packs it so without a word), so it must go to the general path,
    which refuses it; the largest float that rounds to FLT_MAX and infinity itself (T16:
    ``<= INF``) stay on the fast path."""
    from kernelpack.errors import ConstraintError
    from kernelpack.runtime.fastpath import FLOAT32_OVERFLOW

    prog = axpby()
    x, y = _f(torch, [1.0, 0.0]), _f(torch, [0.0, 0.0])
    _warm(prog, x, y, 1.0)
    launched, before = len(_launches(fake)), len(general)
    for v in (FLOAT32_OVERFLOW, -FLOAT32_OVERFLOW):
        with pytest.raises(ConstraintError, match="'a' = .* overflows float32"):
            call_program(prog, x, y, v)
    assert len(_launches(fake)) == launched
    before = len(general)
    below = 2.0 ** 128 - 2.0 ** 104  # FLT_MAX plus less than half its last place
    assert call_program(prog, x, y, below).values()[0] == pytest.approx(3.4028234663852886e38)
    assert call_program(prog, x, y, float("inf")).values()[0] == float("inf")
    assert call_program(prog, x, y, -float("inf")).values()[0] == -float("inf")
    assert len(general) == before


def test_integer_scalars_at_their_range_ends_are_fast(fake, torch, general) -> None:
    """T20/T21 (``lo < v``, ``v < hi``): an i32 scalar at either end of its range fits its
    slot and is launched by the fast path, with that value; one past the end is the general
    path's ConstraintError."""
    from kernelpack.errors import ConstraintError

    prog = keyed()
    x = _f(torch, [0.0])
    _warm(prog, x, 0, 1)
    before = len(general)
    for seed in (-2 ** 31, 2 ** 31 - 1):
        call_program(prog, x, seed, 1)
        assert _launches(fake)[-1][5][2] == seed
    assert len(general) == before
    with pytest.raises(ConstraintError, match="'seed' = 2147483648 does not fit"):
        call_program(prog, x, 2 ** 31, 1)


def test_only_the_symbols_an_expression_reads_key_launch_entries(fake, torch, general) -> None:
    """T22/C- (every int keyed), T23/C15/F08/F65 (no symbol keyed), F69/F73 (a scalar no
    expression reads taken for a keyed one): ``k`` sets the grid, so each value needs its
    own entry; ``seed`` (before it) only reaches its slot, through one entry."""
    prog = keyed()
    x = _f(torch, [1.0, 2.0])
    _warm(prog, x, 0, 1)
    before = len(general)
    for k in (1, 3, 2, 3):
        for seed in (7, -4):
            assert call_program(prog, x, seed, k).values() == [1.0 + seed, 2.0 + seed]
            assert _launches(fake)[-1][1] == (2, 1, k)
            assert _launches(fake)[-1][5][2:] == (seed, k, 2)
    assert len(general) == before
    assert len(bind(prog).planner._cache) == 3  # one plan per k, none per seed


# ---- the torch closure: outputs it allocates ------------------------------------------------
def test_outputs_are_allocated_with_their_own_shape_dtype_and_like_input(fake, torch,
                                                                          general) -> None:
    """T33 (a single output allocated with the first input's dtype), T34 (``empty_like`` of
    ``args[0]`` rather than of the matching input), T35-T37 (several outputs allocated with
    the first one's shape, the single output's dtype, or like the first tensor), F16/F17
    (an output "like" an input of another dtype or shape)."""
    x, w = _f(torch, [1.5, -2.5, 3.0]), _f(torch, [10.0, 20.0])
    progs = scale(), trunc(), mixed()
    for prog, args in zip(progs, ((2.0, x), (x,), (2.0, x, w))):
        _warm(prog, *args)
    before = len(general)
    z = call_program(progs[0], 2.0, x)
    assert (z.dtype, z.shape, z.values()) == (torch.float32, (3,), [3.0, -5.0, 6.0])
    k = call_program(progs[1], x)
    assert (k.dtype, k.shape, k.values()) == (torch.int32, (3,), [1, -2, 3])
    z, u, k, c = call_program(progs[2], 2.0, x, w)
    assert [(t.dtype, t.shape) for t in (z, u, k, c)] == [
        (torch.float32, (3,)), (torch.float32, (2,)), (torch.int32, (3,)), (torch.int32, (2,))]
    assert (z.values(), u.values(), k.values(), c.values()) == (
        [3.0, -5.0, 6.0], [11.0, 21.0], [1, -2, 3], [3, 2])
    assert len(general) == before


# ---- the torch closure: out= ------------------------------------------------------------------
def test_a_single_out_is_checked_for_dtype_and_layout(fake, torch, general) -> None:
    """T40 (out's dtype unchecked), T41 (out's contiguity unchecked): the general path names
    ``out 'z'``; nothing is launched. A fitting ``out=`` is launched by the fast path."""
    prog = axpby()
    x, y = _f(torch, [1.0, 2.0]), _f(torch, [1.0, 1.0])
    _warm(prog, x, y, 1.0)
    launched = len(_launches(fake))
    with pytest.raises(LaunchError, match="out 'z' has dtype int32, expected float32"):
        call_program(prog, x, y, 1.0, out=Tensor([0, 0], torch.int32))
    with pytest.raises(LaunchError, match="out 'z' is not C-contiguous"):
        call_program(prog, x, y, 1.0, out=_f(torch, [0.0, 0.0], contiguous=False))
    assert len(_launches(fake)) == launched
    before = len(general)
    z = _f(torch, [0.0, 0.0])
    assert call_program(prog, x, y, 1.0, out=z) is z and z.values() == [2.0, 3.0]
    assert len(general) == before


def test_out_as_a_one_tuple_and_a_lone_array_for_several_outputs(fake, torch) -> None:
    """T49 (the tuple branch without ``several_out``): ``out=(z,)`` for one output returns
    ``z`` as the general path does, not the tuple; T48 (the single branch without
    ``single_out``): one array for two outputs is the general path's TypeError."""
    prog, two = axpby(), sumdiff()
    x, y = _f(torch, [1.0, 2.0]), _f(torch, [1.0, 1.0])
    _warm(prog, x, y, 1.0)
    _warm(two, x, y)
    z = _f(torch, [0.0, 0.0])
    assert call_program(prog, x, y, 1.0, out=(z,)) is z and z.values() == [2.0, 3.0]
    launched = len(_launches(fake))
    with pytest.raises(TypeError, match="out= has 1 arrays, the program has 2 outputs"):
        call_program(two, x, y, out=z)
    assert len(_launches(fake)) == launched


def test_each_out_array_is_checked_against_its_own_output(fake, torch, general) -> None:
    """T54 (every out= array checked against the first output's dtype), T57 (against the
    first output's shape), T52 (a Tensor subclass taken as a Tensor: the general path's),
    T60 (the negative bit of an out= array unchecked): a fitting tuple of four different
    outputs is launched by the fast path; each misfit is the general path's."""
    prog = mixed()
    x, w = _f(torch, [1.5, -2.5, 3.0]), _f(torch, [10.0, 20.0])
    _warm(prog, 2.0, x, w)

    def outs() -> list:
        return [_f(torch, [0.0] * 3), _f(torch, [0.0] * 2), Tensor([0] * 3, torch.int32),
                Tensor([0] * 2, torch.int32)]

    before = len(general)
    out = tuple(outs())
    got = call_program(prog, 2.0, x, w, out=out)
    assert got is out and [t.values() for t in out] == [[3.0, -5.0, 6.0], [11.0, 21.0],
                                                        [1, -2, 3], [3, 2]]
    assert len(general) == before
    launched = len(_launches(fake))
    bad = outs()
    bad[2] = _f(torch, [0.0] * 3)
    with pytest.raises(LaunchError, match="out 'k' has dtype float32, expected int32"):
        call_program(prog, 2.0, x, w, out=tuple(bad))
    bad = outs()
    bad[3] = Tensor([0] * 3, torch.int32)
    with pytest.raises(LaunchError, match="out 'c' has shape"):
        call_program(prog, 2.0, x, w, out=tuple(bad))
    assert len(_launches(fake)) == launched

    class Sub(Tensor):
        pass

    before = len(general)
    sub = outs()
    sub[1] = Sub([0.0] * 2, torch.float32)
    call_program(prog, 2.0, x, w, out=tuple(sub))
    assert sub[1].values() == [11.0, 21.0] and len(general) == before + 1
    # a single element: the negative bit is asked (torch's _neg_view can make one)
    one = _f(torch, [4.0])
    _warm(prog, 2.0, one, one)
    neg = [_f(torch, [0.0]), _f(torch, [0.0], neg=True), Tensor([0], torch.int32),
           Tensor([0, 0], torch.int32)]
    launched = len(_launches(fake))
    with pytest.raises(LaunchError, match="'u'"):
        call_program(prog, 2.0, one, one, out=tuple(neg))
    assert len(_launches(fake)) == launched


def test_a_stream_of_another_device_with_out_is_refused(fake, torch) -> None:
    """T63: ``stream=`` a torch stream of device 1 for arrays on device 0 would launch the
    kernel there; the general path refuses it. A raw handle says no device and is used."""
    prog = axpby()
    x, y, z = _f(torch, [1.0, 2.0]), _f(torch, [1.0, 1.0]), _f(torch, [0.0, 0.0])
    _warm(prog, x, y, 1.0, out=z)

    class Stream:
        cuda_stream, device_index = 0x99, 1

    launched = len(_launches(fake))
    with pytest.raises(LaunchError, match="stream= is a stream of device 1"):
        call_program(prog, x, y, 1.0, out=z, stream=Stream())
    assert len(_launches(fake)) == launched
    Stream.device_index = 0
    call_program(prog, x, y, 1.0, out=z, stream=Stream())
    assert _launches(fake)[-1][4] == 0x99


def test_host_tensors_on_a_warm_fast_path_are_the_general_paths_error(fake, torch) -> None:
    """T25 (``st is None`` unchecked): a tensor in host memory (``get_device() == -1``) has
    no device state; the general path says so."""
    prog = axpby()
    x, y = _f(torch, [1.0, 2.0]), _f(torch, [1.0, 1.0])
    _warm(prog, x, y, 1.0)
    hx, hy = _f(torch, [1.0, 2.0], device=-1), _f(torch, [1.0, 1.0], device=-1)
    with pytest.raises(LaunchError, match="'x' is in host memory"):
        call_program(prog, hx, hy, 1.0)


def test_float64_scalars_and_programs_without_outputs(fake, torch, general) -> None:
    """T17 (the float32 overflow check applied to a float64 scalar): 1e300 fits a float64
    and is launched by the fast path. T38 (``tuple(made)`` without ``if made``): a program
    with no output returns None, as the general path does."""
    prog, inout = scale(), axpy()
    x, y = _f(torch, [1.0, 2.0]), _f(torch, [1.0, 1.0])
    _warm(prog, 1.0, x)
    _warm(inout, x, y, 0.0)
    before = len(general)
    assert _launches(fake)[-1][5][2] == 0.0
    call_program(prog, 1e300, _f(torch, [0.0, 0.0]))  # (the host kernel stores float32)
    assert _launches(fake)[-1][5][2] == 1e300
    assert call_program(inout, x, y, 2.0) is None and y.values() == [3.0, 5.0]
    assert len(general) == before


# ---- the CuPy closure ---------------------------------------------------------------------------
def _nd(values: list, dtype: str = "float32", **kw: Any) -> NDArray:
    return NDArray(values, dtype, **kw)


def _shifted(a: NDArray, offset: int, shape: tuple) -> NDArray:
    """A stand-in cupy array of ``shape`` over ``a``'s memory from ``offset`` bytes on (a
    view; misaligned when ``offset`` is not a multiple of the element size)."""
    from test_fastpath_fake import _Mem

    view = NDArray([0] * shape[0], "float32", shape)
    view.dtype = a.dtype
    view.data = _Mem(a.data.ptr + offset, a.data.device_id)
    view.base = a  # keeps a's memory alive
    return view


def _pickled(a: NDArray) -> NDArray:
    """``a`` with a NumPy dtype equal to, but not the very object of, NumPy's own."""
    import pickle

    a.dtype = pickle.loads(pickle.dumps(a.dtype))
    return a


def test_cupy_dtypes_that_are_equal_but_not_identical_are_fast(fake, cupy, general) -> None:
    """C04, C09 and the out= checks (``is not`` alone): CuPy hands out NumPy dtypes that
    compare equal without being NumPy's own object; they fit."""
    prog = axpby()
    x, y = _nd([1.0, 2.0]), _nd([1.0, 1.0])
    _warm(prog, x, y, 1.0)
    before = len(general)
    z = _pickled(_nd([0.0, 0.0]))
    assert call_program(prog, _pickled(_nd([1.0, 2.0])), _pickled(_nd([1.0, 1.0])), 1.0,
                        out=z) is z
    assert z.values() == [2.0, 3.0] and len(general) == before


def test_misaligned_cupy_arrays_are_refused(fake, cupy) -> None:
    """C06/C12 (an input's alignment unchecked), C30 (a single out='s): a float32 view two
    bytes into an array faults a kernel; the general path refuses it naming the argument."""
    prog = axpby()
    x, y, z = _nd([1.0, 2.0]), _nd([1.0, 1.0]), _nd([0.0, 0.0])
    _warm(prog, x, y, 1.0)
    launched = len(_launches(fake))
    backing = _nd([0.0] * 4)
    bad = _shifted(backing, 2, (2,))
    for args, out, name in (((bad, y, 1.0), None, "x"), ((x, bad, 1.0), None, "y"),
                            ((x, y, 1.0), bad, "z")):
        with pytest.raises(LaunchError, match=f"'{name}': data pointer .* is not a multiple"):
            call_program(prog, *args, out=out)
    assert len(_launches(fake)) == launched
    # four bytes in: aligned, and the fast path's
    z = _shifted(backing, 4, (2,))
    call_program(prog, x, y, 1.0, out=z)
    assert _launches(fake)[-1][5][2] == backing.data.ptr + 4


def test_cupy_single_out_checks(fake, cupy) -> None:
    """C26 (out's dtype), C28 (its contiguity), C27 (its device, mutant: dtype only): each is
    the general path's error naming ``out 'z'``, before anything is launched."""
    prog = axpby()
    x, y = _nd([1.0, 2.0]), _nd([1.0, 1.0])
    _warm(prog, x, y, 1.0)
    launched = len(_launches(fake))
    with pytest.raises(LaunchError, match="out 'z' has dtype int32"):
        call_program(prog, x, y, 1.0, out=_nd([0, 0], "int32"))
    with pytest.raises(LaunchError, match="out 'z' is not C-contiguous"):
        call_program(prog, x, y, 1.0, out=_nd([0.0, 0.0], contiguous=False))
    other = _nd([0.0, 0.0])
    other.data.device_id = 1
    with pytest.raises(LaunchError, match="device 1"):
        call_program(prog, x, y, 1.0, out=other)
    assert len(_launches(fake)) == launched


def test_cupy_inputs_checks_and_keys(fake, cupy, general) -> None:
    """C11 (the second array's device unchecked), C52 (the second array's shape left out of
    the key: an entry for ``x``'s shape launched a ``y`` of another), C16 (CuPy's current
    device unchecked: the general path switches devices, the fast path would not)."""
    from kernelpack.errors import ConstraintError

    prog = axpby()
    x, y = _nd([1.0, 2.0]), _nd([1.0, 1.0])
    _warm(prog, x, y, 1.0)
    launched = len(_launches(fake))
    far = _nd([1.0, 1.0])
    far.data.device_id = 1
    with pytest.raises(LaunchError, match="device 1, earlier arguments on device 0"):
        call_program(prog, x, far, 1.0)
    with pytest.raises(ConstraintError, match="y"):
        call_program(prog, x, _nd([1.0, 1.0, 1.0]), 1.0)
    assert len(_launches(fake)) == launched
    before = len(general)
    cupy.current.device = 1
    try:
        assert call_program(prog, x, y, 2.0).values() == [3.0, 5.0]
    finally:
        cupy.current.device = 0
    assert len(general) == before + 1


def test_cupy_outputs_allocated_and_checked_per_output(fake, cupy, general) -> None:
    """C21-C23 (outputs allocated with the first input's dtype, the first output's shape, or
    like the first tensor), C24 (a program without outputs returns None), C36/C39/C40/C41/
    C49 (an out= tuple's arrays checked for dtype, shape, alignment each against its own
    output), C35 (a non-cupy array in the tuple: the general path's), C37 (device)."""
    prog, inout = mixed(), axpy()
    x, w = _nd([1.5, -2.5, 3.0]), _nd([10.0, 20.0])
    _warm(prog, 2.0, x, w)
    _warm(inout, x, _nd([0.0] * 3), 0.0)
    before = len(general)
    z, u, k, c = call_program(prog, 2.0, x, w)
    assert [(str(t.dtype), t.shape) for t in (z, u, k, c)] == [
        ("float32", (3,)), ("float32", (2,)), ("int32", (3,)), ("int32", (2,))]
    assert (z.values(), u.values(), k.values(), c.values()) == (
        [3.0, -5.0, 6.0], [11.0, 21.0], [1, -2, 3], [3, 2])
    assert call_program(inout, x, _nd([0.0] * 3), 1.0) is None

    def outs() -> list:
        return [_nd([0.0] * 3), _nd([0.0] * 2), _nd([0] * 3, "int32"), _nd([0] * 2, "int32")]

    out = tuple(outs())
    assert call_program(prog, 2.0, x, w, out=out) is out
    assert [a.values() for a in out] == [[3.0, -5.0, 6.0], [11.0, 21.0], [1, -2, 3], [3, 2]]
    assert len(general) == before
    launched = len(_launches(fake))
    cases = {"k": (2, _nd([0.0] * 3), "out 'k' has dtype float32"),
             "c": (3, _nd([0] * 3, "int32"), "out 'c' has shape"),
             "u": (1, _shifted(_nd([0.0] * 3), 2, (2,)), "'u': data pointer"),
             "z": (0, _nd([0.0] * 3, contiguous=False), "out 'z' is not C-contiguous")}
    for i, wrong, message in cases.values():
        bad = outs()
        bad[i] = wrong
        with pytest.raises(LaunchError, match=message):
            call_program(prog, 2.0, x, w, out=tuple(bad))
    bad = outs()
    bad[3].data.device_id = 1
    with pytest.raises(LaunchError, match="device 1"):
        call_program(prog, 2.0, x, w, out=tuple(bad))
    assert len(_launches(fake)) == launched

    class Sub(NDArray):
        pass

    before = len(general)
    sub = outs()
    sub[1] = Sub([0.0] * 2)
    call_program(prog, 2.0, x, w, out=tuple(sub))
    assert sub[1].values() == [11.0, 21.0] and len(general) == before + 1


def test_cupy_out_tuple_and_stream_forms(fake, cupy) -> None:
    """C34 (``out=(z,)`` for one output returned the tuple), C32 (one array for two outputs
    taken as a single out=), C44 (a stream of another device with out= not refused)."""
    prog, two = axpby(), sumdiff()
    x, y = _nd([1.0, 2.0]), _nd([1.0, 1.0])
    _warm(prog, x, y, 1.0)
    _warm(two, x, y)
    z = _nd([0.0, 0.0])
    assert call_program(prog, x, y, 1.0, out=(z,)) is z and z.values() == [2.0, 3.0]
    launched = len(_launches(fake))
    with pytest.raises(TypeError, match="out= has 1 arrays, the program has 2 outputs"):
        call_program(two, x, y, out=z)

    class Stream:
        ptr, device_id = 0x99, 1

    with pytest.raises(LaunchError, match="stream= is a stream of device 1"):
        call_program(prog, x, y, 1.0, out=z, stream=Stream())
    assert len(_launches(fake)) == launched


# ---- fastpath.py: launch entries -------------------------------------------------------------
def test_an_empty_grid_launches_nothing(fake, torch, general) -> None:
    """F12 (``gx and gy`` without ``gz``): a grid of (2, 1, 0) blocks is no launch."""
    prog = keyed()
    x = _f(torch, [1.0])
    _warm(prog, x, 0, 1)
    launched, before = len(_launches(fake)), len(general)
    call_program(prog, x, 0, 0)
    assert len(_launches(fake)) == launched and len(general) == before


def test_48_kib_of_shared_memory_is_fast_and_more_is_the_general_paths(monkeypatch, torch,
                                                                     general) -> None:
    """F13 (``>=``): exactly 48 KiB needs no raised limit and is launched by the fast path;
    F14 (no limit at all): 4 bytes more must go where the function's limit is raised (the
    fake driver of test_review10_shared_memory.py refuses it otherwise, as a GPU does)."""
    from test_review10_shared_memory import _GpuLikeFake

    fake = install(monkeypatch, _GpuLikeFake())
    prog = staged()
    x = _f(torch, [0.0] * 12288)
    _warm(prog, x)
    before = len(general)
    call_program(prog, x)
    assert _launches(fake)[-1][3] == 48 * 1024 and len(general) == before
    y = _f(torch, [0.0] * 12289)
    _warm(prog, y)
    before = len(general)
    call_program(prog, y)
    assert _launches(fake)[-1][3] == 48 * 1024 + 4 and len(general) == before + 1
    assert not [c for c in fake.calls if c[0] == "refused launch"]


def test_empty_arrays_inside_others_share_no_memory(fake, torch, general) -> None:
    """Size-0 arrays hold no bytes wherever they point; the general path agrees. F45 (an
    empty out= checked against the inputs), F47 (empty inputs kept in an out='s spans), F52
    and F55 (an empty out= checked against another out=) sent such calls to the general path
    for nothing."""
    prog = mixed()
    w = _f(torch, [1.0, 2.0])
    e = Tensor([], torch.float32, shape=(0,))
    _warm(prog, 1.0, e, w)

    def inside(t: Tensor, dtype: Any) -> Tensor:
        view = Tensor([], dtype, shape=(0,))
        view.data_ptr = lambda: t.data_ptr() + 4  # an empty view one element in
        view.base = t
        return view

    outs = [_f(torch, []), _f(torch, [0.0, 0.0]), Tensor([], torch.int32), Tensor([0, 0],
                                                                                 torch.int32)]
    before = len(general)
    for case in range(3):
        out = list(outs)
        x = e
        if case == 0:
            out[2] = inside(w, torch.int32)  # an empty out= inside input w
        elif case == 1:
            out[2] = inside(out[1], torch.int32)  # an empty out= inside out u (before it)
        else:
            x = inside(out[1], torch.float32)  # an empty input inside out u
        call_program(prog, 1.0, x, w, out=tuple(out))
        assert out[1].values() == [2.0, 3.0] and out[3].values() == [0, 2]
    assert len(general) == before


def test_torch_path_falls_back_to_cupys(fake, torch, cupy, general) -> None:
    """F72 (torch's fallback the general path, not CuPy's fast path): with both frameworks a
    cupy call on a warm program is launched by CuPy's closure."""
    prog = axpby()
    _warm(prog, _f(torch, [1.0]), _f(torch, [1.0]), 1.0)
    _warm(prog, _nd([1.0]), _nd([2.0]), 1.0)
    before = len(general)
    assert call_program(prog, _nd([3.0]), _nd([2.0]), 1.0).values() == [5.0]
    assert call_program(prog, _f(torch, [3.0]), _f(torch, [1.0]), 1.0).values() == [4.0]
    assert len(general) == before


def test_outputs_made_for_a_call_launch_on_their_devices_current_stream(monkeypatch,
                                                                      torch) -> None:
    """T39 (``raw_stream(0)``): a call on device 1 without ``out=`` launches on device 1's
    current stream, not device 0's."""
    fake = install(monkeypatch, FakeDriver(devices=2, kernels=KERNELS))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0x100 + device)
    prog = axpby()
    for device in (0, 1, 1):
        x, y = _f(torch, [1.0], device=device), _f(torch, [2.0], device=device)
        assert call_program(prog, x, y, 1.0).values() == [3.0]
        assert _launches(fake)[-1][4] == 0x100 + device


def test_cupy_argument_checks_beyond_the_first(fake, cupy, general) -> None:
    """C05 (the first array's contiguity), C08 (the second array's dtype), C33 (an out=
    tuple of the wrong length), C38 (an out= tuple array's contiguity): the general path's
    errors, nothing launched. C02/C07 (the type checks): a subclass of cupy.ndarray is the
    general path's; C53/C54 (scalars needing conversion) too; C15 (symbols keyed): ``k``
    sets the grid; C13 (the float32 overflow check) and C14 (the int range check, which
    ``struct`` does not repeat when the grid is empty and nothing is packed): the general
    path refuses them."""
    prog, two, kprog = axpby(), sumdiff(), keyed()
    x, y = _nd([1.0, 2.0]), _nd([1.0, 1.0])
    _warm(prog, x, y, 1.0)
    _warm(two, x, y)
    _warm(kprog, x, 0, 1)
    launched = len(_launches(fake))
    with pytest.raises(LaunchError, match="'x' is not C-contiguous"):
        call_program(prog, _nd([1.0, 2.0], contiguous=False), y, 1.0)
    with pytest.raises(LaunchError, match="'y' has dtype int32"):
        call_program(prog, x, _nd([1, 1], "int32"), 1.0)
    with pytest.raises(TypeError, match="out= has 1 arrays, the program has 2 outputs"):
        call_program(two, x, y, out=(_nd([0.0, 0.0]),))
    with pytest.raises(LaunchError, match="out 'd' is not C-contiguous"):
        call_program(two, x, y, out=(_nd([0.0, 0.0]), _nd([0.0, 0.0], contiguous=False)))
    assert len(_launches(fake)) == launched

    class Sub(NDArray):
        pass

    before = len(general)
    for i, args in enumerate(((Sub([1.0, 2.0]), y, 1.0), (x, Sub([1.0, 1.0]), 1.0),
                              (x, y, 2))):
        assert call_program(prog, *args).values()[0] == (2.0 if i < 2 else 3.0)
        assert len(general) == before + i + 1, i
    assert call_program(kprog, x, True, 1).values() == [2.0, 3.0]
    assert len(general) == before + 4
    for k in (1, 3):
        call_program(kprog, x, 0, k)
        assert _launches(fake)[-1][1] == (2, 1, k)
    assert len(general) == before + 4
    from kernelpack.errors import ConstraintError
    from kernelpack.runtime.fastpath import FLOAT32_OVERFLOW

    launched = len(_launches(fake))
    with pytest.raises(ConstraintError, match="'a' = .* overflows float32"):
        call_program(prog, x, y, FLOAT32_OVERFLOW)
    call_program(kprog, x, 0, 0)  # an empty grid: the entry for k = 0
    with pytest.raises(ConstraintError, match="'seed' = 2147483648 does not fit"):
        call_program(kprog, x, 2 ** 31, 0)
    assert len(_launches(fake)) == launched


def test_a_complex_cupy_array_needs_only_its_parts_alignment(fake, cupy, general) -> None:
    """C47 (a complex64 array's pointer checked against 8 bytes): its parts are float32, so
    4-byte alignment is enough, and such a view is launched by the fast path."""
    prog = copy_c64()

    def c64(values: list, ptr_shift: int = 0) -> NDArray:
        backing = _nd(values + [0.0, 0.0])  # float32 pairs, one spare element
        a = _shifted(backing, ptr_shift, (len(values) // 2,)) if ptr_shift else backing
        a.dtype, a.shape = _complex64(), (len(values) // 2,)
        return a

    x = c64([1.0, 2.0])
    _warm(prog, x, out=c64([0.0, 0.0]))  # (the stand-in allocates no complex arrays)
    before = len(general)
    src = c64([0.0, 0.0, 0.0])
    ctypes.memmove(src.data.ptr + 4, struct.pack("<2f", 3.0, 4.0), 8)
    z = c64([0.0, 0.0])
    call_program(prog, _view_at(src, 4), out=z)
    assert _launches(fake)[-1][5][0] == src.data.ptr + 4 and len(general) == before
    assert struct.unpack("<2f", ctypes.string_at(z.data.ptr, 8)) == (3.0, 4.0)


def _complex64() -> Any:
    import numpy

    return numpy.dtype("complex64")


def _view_at(a: NDArray, offset: int) -> NDArray:
    """``a``'s first element's worth of complex64 from ``offset`` bytes on."""
    view = _shifted(a, offset, (1,))
    view.dtype, view.shape = _complex64(), (1,)
    return view


def test_cupy_stream_without_out_allocates_from_that_streams_arena(fake, cupy, general,
                                                                  monkeypatch) -> None:
    """C01 (``stream=`` without ``out=`` allocating on the current stream): the outputs must
    come from that stream's arena of CuPy's pool, made while it is current. Since session 44
    the closure does so itself (before, such calls went to the general path)."""
    install_external_stream(cupy, monkeypatch)
    made_on: list = []
    empty = cupy.empty
    monkeypatch.setattr(cupy, "empty", lambda shape, dtype: made_on.append(
        cupy.current.stream.ptr) or empty(shape, dtype))
    prog = axpby()
    x, y = _nd([1.0, 2.0]), _nd([1.0, 1.0])
    _warm(prog, x, y, 1.0)
    before, made_on[:] = len(general), []
    assert call_program(prog, x, y, 1.0, stream=5).values() == [2.0, 3.0]
    assert _launches(fake)[-1][4] == 5 and len(general) == before
    assert made_on == [5] and cupy.current.stream.ptr == 0


def test_several_real_outs_are_not_asked_for_lazy_views(fake, torch, general,
                                                        monkeypatch) -> None:
    """T61 (``view_out`` ignored for an out= tuple): real outputs of more than one element
    cannot be lazy views that pass the contiguity check, so asking costs two calls each for
    nothing (the single out= case: test_lazy_views.py)."""
    prog = sumdiff()
    x, y = _f(torch, [1.0, 2.0]), _f(torch, [3.0, 5.0])
    _warm(prog, x, y)
    asked: list = []
    for name in ("is_conj", "is_neg"):
        original = getattr(Tensor, name)
        monkeypatch.setattr(Tensor, name, lambda t, o=original, n=name: asked.append(n) or o(t))
    before = len(general)
    s, d = _f(torch, [0.0, 0.0]), _f(torch, [0.0, 0.0])
    call_program(prog, x, y, out=(s, d))
    assert s.values() == [4.0, 7.0] and len(general) == before
    assert asked == []


def test_scratch_buffers_apart_and_none_when_empty(fake, torch, general, monkeypatch) -> None:
    """T66 (every scratch buffer at the allocation's base): two buffers share no memory;
    T65 (``scratch[0]`` unchecked): a call whose scratch has 0 bytes allocates none."""
    made: list = []
    original = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: made.append(kw["dtype"].name)
                        or original(*a, **kw))
    prog = through()
    x = _f(torch, [1.0, 2.0])
    _warm(prog, x)
    del made[:]
    assert call_program(prog, x).values() == [3.0, 6.0]
    assert made == ["uint8"]  # the scratch; the output is made like x
    e = Tensor([], torch.float32, shape=(0,))
    _warm(prog, e)
    del made[:]
    before = len(general)
    assert call_program(prog, e).shape == (0,)
    assert made == [] and len(general) == before


def test_cupy_scratch_buffers_apart_and_none_when_empty(fake, cupy, general,
                                                      monkeypatch) -> None:
    """C45 and C51: T66 and T65 on the CuPy closure."""
    made: list = []
    original = cupy.empty
    import numpy

    def empty(shape: Any, dtype: Any) -> NDArray:  # cupy.empty also takes an int and a type
        made.append(numpy.dtype(dtype).name)
        return original((shape,) if isinstance(shape, int) else shape, numpy.dtype(dtype))

    monkeypatch.setattr(cupy, "empty", empty)
    prog = through()
    x = _nd([1.0, 2.0])
    _warm(prog, x)
    del made[:]
    before = len(general)
    assert call_program(prog, x).values() == [3.0, 6.0]
    assert made == ["uint8"]
    e = _nd([])
    _warm(prog, e)
    del made[:]
    assert call_program(prog, e).shape == (0,)
    assert made == [] and len(general) == before


def test_a_repeated_launch_is_the_general_paths(fake, torch, general) -> None:
    """F01 (``fast_variant`` without its ``count is None``): a launch repeated three times
    was launched once per call by the fast path."""
    prog = bumped()
    x = _f(torch, [0.0, 10.0])
    _warm(prog, x)
    assert x.values() == [6.0, 16.0]
    before = len(general)
    call_program(prog, x)
    assert x.values() == [9.0, 19.0] and len(general) == before + 1


def test_a_program_without_tensor_inputs_has_no_fast_path(fake, torch) -> None:
    """F05 (``fits`` without its tensor-input check): the closures are built around the
    first tensor input; a program without one must keep the general path, whose outputs
    come from ``out=``."""
    prog = iota()
    for n in (3, 2, 3):
        z = _f(torch, [9.0] * n)
        assert call_program(prog, n, out=z) is z and z.values() == [float(i) for i in range(n)]
    assert bind(prog).call == bind(prog).__call__



def test_a_failed_launch_of_several_is_a_launch_error(fake, torch) -> None:
    """F33 (``fire_all`` without its relaunch/raise): when a launch of a several-launch call
    fails (and the context is the device's), the call raises the driver's error rather
    than returning an output that was never written."""
    from fake_driver import CUresult

    prog = twice()
    x = _f(torch, [1.0, 2.0])
    _warm(prog, x)
    fake.launch_error = CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(LaunchError, match="twice: launching copyn"):
        call_program(prog, x)
