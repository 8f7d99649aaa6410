"""Fast paths for PyTorch and CuPy callers: per-call work reduced to what must happen.

Most calls are "tensors of one framework in, plain launches". For those, a closure
built at bind time (:mod:`.fast_torch`, :mod:`.fast_cupy`) reads each tensor's pointer, dtype,
device, contiguity and shape through the framework's own attributes, looks the shapes up in a
per-program cache of launch-ready entries (made once per distinct shape from the program's
:class:`~kernelpack.planner.Plan`: binding, checks and every expression are the planner's),
allocates the outputs (or checks ``out=``) and the variant's scratch (one buffer of the
framework, :func:`scratch_layout`), writes the slots and launches. A variant whose launches
repeat or whose scratch must be zeroed is the general path's: the key is remembered as such
(:data:`GENERAL`), so that its calls pay one cache lookup before going there.

Anything unusual (another array type, a failed check, a first call on a new device, a scalar
needing conversion, CuPy's scratch on a default stream) falls back to the general path
*before* any launch, so the general path both handles it and produces the error message: the
fast paths never have to explain a failure, which keeps them short. (A ``stream=`` of another
device than the arrays' is refused on the fast paths themselves, with the general path's
LaunchError and words: ``arrays.check_stream_device``.)

This module holds what both frameworks share: the plan cache (:class:`FastCore`), the
per-thread state (parameter blocks and the context last seen current), and the rare paths
(making the context current, a failed launch), kept out of the hot closures.

Per-thread parameter blocks: ``cuLaunchKernel`` releases the GIL while the driver reads the
block, so a block shared by threads would need a lock around "write, launch". Each thread gets
its own blocks instead (made on its first call), so concurrent callers never wait or mix slots.

The current context: a launch on a legacy/per-thread default stream (handle < 3) goes to the
thread's *current* context, so it must be the device's primary context. Asking the driver
(``cuCtxGetCurrent`` through cuda.bindings, then comparing handles) costs about 0.4 µs a call
(H200 host; a sixth of the fast path's own cost), so a thread remembers the device it last
confirmed. With one visible device the only other states of the thread are "no context" (the
launch then fails; :meth:`FastCore.relaunch` asks the driver, sets the context and launches
again) or a context the caller created and made current itself with the driver API, in which
kernelpack then launches, as torch's own kernels would. With several devices every
default-stream launch asks the driver, because the caller may have switched the thread to
another device (``torch.cuda.set_device``) since the last call.
"""

from __future__ import annotations

import ctypes
import math
import struct
import sys
import threading
from typing import Any, Callable, Collection, Sequence

from ..errors import KernelPackError
from .aliasing import conflicts
from .binding import fills_of
from .device import PUSHED
from .execute import DEFAULT_SHARED_MEM
from .native import launcher

__all__ = ["make_fast_path", "fits", "fast_variant", "split_scalars", "keyed_symbols",
           "lazy_view_checks", "out_overlap", "out_overlaps_input", "outs_conflict",
           "scratch_layout", "written_pairs", "written_conflict", "WRITTEN_SPAN", "FastCore",
           "ThreadState", "GENERAL", "FLOAT32_OVERFLOW"]

Call = Callable[[Any, Any, Any], Any]

# Launch-ready entries kept per program (distinct input shapes); cleared when full.
PLAN_CACHE_SIZE = 256
# A key whose calls go to the general path, remembered as such in the plan cache (falsy, and
# not None, which ``cache.get`` answers for a key not planned yet).
GENERAL = False
# Each scratch buffer's offset in a fast call's one scratch allocation is a multiple of this
# (the general path allocates each apart; frameworks align allocations to at least 256 bytes).
SCRATCH_ALIGN = 256
_POINTER_SIZE = struct.calcsize("@P")


def fast_variant(summary_variant: Any, spec: Any) -> bool:
    """Whether calls planned to ``spec`` (a :class:`~.binding.VariantSpec`, ``summary_variant``
    its summary variant) can take a fast path: every launch once and plain (each parameter a
    slot of the value list), and scratch that needs no zeroing (a fast call allocates its
    scratch as one buffer of the caller's framework; a memset is the general path's)."""
    return (all(ln.count is None for ln in summary_variant.launches)
            and all(ls.simple for ls in spec.launches)
            and not any(s.zero_init for s in spec.scratch))


def fits(bs: Any) -> bool:
    """Whether a program's calls can take a fast path at all: no zero-filled outputs, a tensor
    input, scalars that need no conversion, and some variant :func:`fast_variant` takes. The
    planner picks one variant per shape; a shape whose variant the fast paths do not take
    (repeated launches, zeroed scratch) is remembered as such and goes to the general path."""
    if any(o.zero_init for o in bs.outputs):
        return False
    if not any(fast_variant(sv, v) for sv, v in zip(bs.summary.variants, bs.variants)):
        return False
    if not any(s.is_tensor for s in bs.inputs):
        return False
    # f16/bf16/bool scalars need conversion: the general path does it
    return all(s.is_tensor or s.dtype.name in ("float32", "float64") or s.dtype.is_integer
               for s in bs.inputs)


def _trust_thread_context() -> bool:
    """Whether a thread may skip ``cuCtxGetCurrent`` once it has seen the primary context
    current (only with a single visible device; see the module docstring)."""
    from .device import device_count

    return device_count() == 1


class ThreadState:
    """One thread's state for one program: its parameter blocks (``bufs[j]`` and the
    ``kernelParams`` address ``addrs[j]`` for launch ``j``, numbered over every variant's
    launches in order) and ``ctx``, the device whose
    primary context this thread was last confirmed to have current (-1: none)."""

    __slots__ = ("ctx", "bufs", "addrs", "_keep")

    def __init__(self, layouts: list[tuple[int, list[int]]]) -> None:
        self.ctx = -1
        self.bufs: list[bytearray] = []
        self.addrs: list[int] = []
        self._keep: list[Any] = []
        for size, offsets in layouts:
            # As LaunchSpec.make_block: one bytearray, the slots at 0 and the ``void*`` array
            # after them, its address taken through a ``c_char`` view. A ctypes array type
            # (``create_string_buffer``'s ``c_char * n``, ``c_void_p * n``) is made per new
            # size, 20-50 µs of a thread's first call. The view, kept in ``_keep``, keeps the
            # bytearray exported: it can never be resized (moved) under the driver.
            count = len(offsets)
            at = -(-size // _POINTER_SIZE) * _POINTER_SIZE
            mem = bytearray(max(at + _POINTER_SIZE * count, 1))
            view = ctypes.c_char.from_buffer(mem)
            base = ctypes.addressof(view)
            if count:
                struct.pack_into(f"@{count}P", mem, at, *[base + o for o in offsets])
            self.bufs.append(mem)
            self.addrs.append(base + at if count else 0)
            self._keep.append(view)


class FastCore:
    """The framework-independent half: the plan cache, per-thread state and the rare paths."""

    def __init__(self, bp: Any, out_tokens: list[Any], in_tokens: dict[int, Any]) -> None:
        from . import driver as _drv
        from .execute import _streams, cu_stream

        bs = bp.bound
        self.bp = bp
        self.name = bp.name
        self.plan_shapes = bp.plan_shapes
        self.variants = bs.variants
        self.ntensors = bs.n_tensors
        self.tensor_index = [i for i, s in enumerate(bs.inputs) if s.is_tensor]
        # complex tensors (inputs by argument position, then the outputs): torch may hand any
        # of them over as a lazily conjugated view (see plan())
        self.complex_in = {i for i, s in enumerate(bs.inputs) if s.is_tensor
                           and s.dtype.kind == "c"}
        self.complex_out = [o.dtype.kind == "c" for o in bs.outputs]
        self.in_tokens = in_tokens
        # per tensor input (in key order): its value slot and element size (see out_overlap)
        self.in_spans = [(s.slot, s.dtype.itemsize) for s in bs.inputs if s.is_tensor]
        self.in_written = [s.written for s in bs.inputs if s.is_tensor]  # role inout
        self.in_names = [s.name for s in bs.inputs if s.is_tensor]
        self.in_place_refused = bs.in_place_refused
        # the planner's scalars: a key carries the symbols an expression reads; the others
        # do not matter to a launch entry (see keyed_symbols)
        self.keyed = keyed = keyed_symbols(bs)
        self.symbol_positions = [s.slot for s in bs.inputs if not s.is_tensor and s.is_symbol
                                 and s.name in keyed]
        self.n_scalars = bs.n_scalars
        self.fill_from = bs.fill_from
        self.nfill = bs.nvals - bs.fill_from
        self.outputs = [(o.slot, o.name, tok) for o, tok in zip(bs.outputs, out_tokens)]
        # every variant's launches in one list (``j`` below): ``first[v]`` is variant v's first
        self.launches: list[tuple[Any, Any, Any]] = []  # (getter, pack_into, kernel)
        self.first: list[int] = []
        self.layouts: list[tuple[int, list[int]]] = []
        identity = list(range(bs.nvals))
        self.fast = [fast_variant(sv, v) for sv, v in zip(bs.summary.variants, bs.variants)]
        for variant, fast in zip(bs.variants, self.fast):
            self.first.append(len(self.launches))
            for ls in variant.launches:
                # getter None: the parameters are the call's value list itself, in order (the
                # usual case), so the block is packed from it with no intermediate tuple; a
                # launch of a variant the fast paths do not take is never packed here
                getter = None if not fast or ls.order == identity else ls.getter
                self.launches.append((getter, ls.layout.pack_into if fast else None, ls.kernel))
                self.layouts.append((ls.size, ls.offsets))
        self.cache: dict[tuple, Any] = {}
        self.local = threading.local()
        self.trust_context = _trust_thread_context()
        self.launch = launcher().launch
        self.error_for = _drv.error_for
        self.streams, self.cu_stream = _streams, cu_stream

    # ---- once per shape ---------------------------------------------------------------------
    def plan(self, key: tuple) -> Any:
        """The launch-ready entry for one key (input shapes, then the symbol scalars), made
        from the planner's plan, or :data:`GENERAL` when calls with this key go to the
        general path: the planner refuses it (the general path asks again and raises its
        error), its variant is not one the fast paths take (:func:`fast_variant`), or a launch
        takes more than 48 KiB of dynamic shared memory (the general path raises the
        function's limit first). Cached per key, :data:`GENERAL` included.

        Returns ``(fills, shapes, todo, likes, one, views, view_out, overlap, scratch,
        pairs)``: the computed values (the value list's last ``len(fills)`` slots, or None
        when there are none), output shapes, the non-empty launches ``(getter, pack_into, j,
        gx, gy, gz, bx, by, bz, smem)``, per output the index of an input it can be
        allocated like (-1: none), the launch when there is exactly one (else None), the
        arguments to check for torch's lazy conjugate/negative views, whether ``out=`` needs
        that check (see :func:`lazy_view_checks`), what a single ``out=`` is checked against
        for partial overlap with an input (see :func:`out_overlap`; with several outputs a
        tuple of one such pair per output, see :func:`outs_conflict`), and the variant's
        scratch as one allocation (see :func:`scratch_layout`), None when it has none, and
        the argument pairs that may not share memory (see :func:`written_pairs`)."""
        entry = self._plan(key)
        if len(self.cache) >= PLAN_CACHE_SIZE:
            self.cache.clear()
        self.cache[key] = entry
        return entry

    def _plan(self, key: tuple) -> Any:
        nt = self.ntensors
        scalars: list[Any] = [0] * self.n_scalars
        for pos, v in zip(self.symbol_positions, key[nt:]):
            scalars[pos] = v
        try:
            plan = self.plan_shapes(key[:nt], scalars)
        except (KernelPackError, TypeError, ValueError, ArithmeticError):
            return GENERAL
        if not self.fast[plan.variant]:
            return GENERAL
        fills = fills_of(self.variants[plan.variant], plan)
        fills += [0] * (self.nfill - len(fills))  # the value list keeps its length
        first = self.first[plan.variant]
        shapes = tuple(plan.allocations[oname].shape for _, oname, _ in self.outputs)
        todo = []
        for pl in plan.launches:
            (gx, gy, gz), (bx, by, bz) = pl.grid, pl.block
            if gx and gy and gz:
                if pl.shared_mem > DEFAULT_SHARED_MEM:
                    # the function's limit must be raised on the call's device first
                    # (execute.allow_shared): the general path does it
                    return GENERAL
                j = first + pl.index
                getter, pack, _ = self.launches[j]
                todo.append((getter, pack, j, gx, gy, gz, bx, by, bz, pl.shared_mem))
        # An output shaped and typed like an input can be allocated "like" it, which is
        # cheaper than parsing dtype/device arguments; inputs here are contiguous.
        likes = []
        for (_, _, tok), shape in zip(self.outputs, shapes):
            likes.append(next((i for i, ishape in zip(self.tensor_index, key)
                               if self.in_tokens[i] is tok and tuple(ishape) == shape), -1))
        one = todo[0] if len(todo) == 1 else None
        views, view_out = lazy_view_checks(self.tensor_index, key, self.complex_in, shapes,
                                           self.complex_out)
        # inputs an output or inout argument may not be in place over (in_place.py) are
        # checked like written ones
        refused = self.in_place_refused(plan.variant)
        per_output = tuple(
            out_overlap(self.in_spans, key, plan.allocations[oname].nbytes,
                        [w or (oname, n) in refused for w, n in zip(self.in_written,
                                                                    self.in_names)])
            for _, oname, _ in self.outputs)
        # one output: its (nbytes, spans); several: one such pair per output
        overlap: Any = per_output[0] if len(per_output) == 1 else (
            per_output if per_output else (0, ()))
        scratch = scratch_layout(self.variants[plan.variant], plan.allocations)
        pairs = written_pairs(self.in_spans, self.in_written, key, self.in_names,
                              refused) if any(self.in_written) else ()
        return (fills or None, shapes, tuple(todo), tuple(likes), one, views, view_out,
                overlap, scratch, pairs)

    # ---- once per thread ----------------------------------------------------------------------
    def thread_state(self) -> ThreadState:
        """The calling thread's :class:`ThreadState` (made on its first call)."""
        ts = self.local.__dict__.get("ts")
        if ts is None:
            ts = self.local.ts = ThreadState(self.layouts)
        return ts

    # ---- launching ----------------------------------------------------------------------------
    def fire(self, st: Any, device: int, sh: int, one: tuple | None, todo: tuple,
             vals: list) -> bool:
        """Launch a call's work on stream handle ``sh``: ``one``, its single launch, or (None)
        the several or none of ``todo``. False, with nothing launched, when a value does not
        fit its parameter (the general path then explains). On a default stream the current
        context decides: the device's is made current first, and when it had to be pushed
        over another device's the thread gets its own back after the launches. The torch and
        CuPy closures' common tail."""
        try:
            ts = self.local.ts
        except AttributeError:
            ts = self.thread_state()
        pushed = sh < 3 and ts.ctx != device and self.ensure_context(st, ts, device)
        try:
            cs = self.streams.get(sh)
            if cs is None:
                cs = self.cu_stream(sh)
            if one is None:  # several launches (or none: empty grids)
                return self.fire_all(st, ts, device, sh, cs, todo, vals)
            getter, pack, j, gx, gy, gz, bx, by, bz, smem = one
            try:  # struct range-checks the ints (a float32 overflow: split_scalars)
                pack(ts.bufs[j], 0, *(vals if getter is None else getter(vals)))
            except Exception:  # struct.error / OverflowError: the general path explains
                return False
            err, = self.launch(st.flat[j], gx, gy, gz, bx, by, bz, smem, cs, ts.addrs[j], 0)
            if err:
                self.relaunch(err, st, ts, device, sh, one, cs)
            return True
        finally:
            if pushed:
                self.pop_context(st)

    def fire_all(self, st: Any, ts: ThreadState, device: int, sh: int, cs: Any, todo: tuple,
                 vals: list) -> bool:
        """Write every block, then launch them in order (a program of several launches, or
        none); False, with nothing launched, when a value does not fit its parameter."""
        bufs = ts.bufs
        try:
            for item in todo:
                getter = item[0]
                item[1](bufs[item[2]], 0, *(vals if getter is None else getter(vals)))
        except Exception:  # struct.error / OverflowError: the general path explains
            return False
        funcs, addrs, launch = st.flat, ts.addrs, self.launch
        for item in todo:
            _, _, j, gx, gy, gz, bx, by, bz, smem = item
            err, = launch(funcs[j], gx, gy, gz, bx, by, bz, smem, cs, addrs[j], 0)
            if err:
                self.relaunch(err, st, ts, device, sh, item, cs)
        return True

    # ---- rare paths -------------------------------------------------------------------------
    def ensure_context(self, st: Any, ts: ThreadState, device: int) -> bool:
        """Make ``device``'s primary context current on this thread if it is not (asking the
        driver), and remember it when the thread may trust that (one visible device). True
        when it was pushed over another device's context: the caller pops it
        (:meth:`pop_context`) after its launches."""
        if self.context_was_lost(st) == PUSHED:
            return True
        if self.trust_context:
            ts.ctx = device
        return False

    def context_was_lost(self, st: Any) -> int:
        """:meth:`.Device.enter` of ``st``'s device: whether the calling thread's current
        context was not that device's (0 it was; 1 none was, now set; :data:`PUSHED` another
        device's was, the device's pushed over it: the caller pops it (:meth:`pop_context`)
        after launching)."""
        return st.device.enter()

    def pop_context(self, st: Any) -> None:
        """Undo :meth:`context_was_lost`'s push: the thread's own context current again."""
        st.device.leave()

    def launch_error(self, err: Any, j: int, grid: tuple, block: tuple, smem: int) -> Exception:
        """The LaunchError (or DeviceError, ...) for launch ``j`` failing with ``err``."""
        return self.error_for(err, f"{self.name}: launching {self.launches[j][2]} with grid "
                                   f"{grid} block {block} shared_mem {smem}")

    def relaunch(self, err: Any, st: Any, ts: ThreadState, device: int, sh: int, item: tuple,
                 cs: Any) -> None:
        """Launch ``item`` failed with ``err``. On a default stream whose context this thread
        only remembered, the context may have changed: check it, and launch again when it
        was not the device's; otherwise raise the LaunchError for ``err``."""
        _, _, j, gx, gy, gz, bx, by, bz, smem = item
        if sh < 3 and ts.ctx == device:
            ts.ctx = -1
            lost = self.context_was_lost(st)
            if lost:
                err, = self.launch(st.flat[j], gx, gy, gz, bx, by, bz, smem, cs,
                                   ts.addrs[j], 0)
                if lost == PUSHED:
                    self.pop_context(st)
                elif not err and self.trust_context:
                    ts.ctx = device
                if not err:
                    return
        exc = self.launch_error(err, j, (gx, gy, gz), (bx, by, bz), smem)
        try:  # the local would tie the error's traceback (and the call's outputs) in a cycle
            raise exc from exc.__cause__
        finally:
            del exc


def scratch_layout(variant: Any, allocations: dict) -> tuple[int, tuple] | None:
    """A variant's scratch buffers as one allocation of a fast call: ``(total bytes,
    ((value slot, offset), ...))``, each offset a multiple of :data:`SCRATCH_ALIGN`; None
    when the variant has none. ``allocations``: the plan's, by name. One allocation, not one
    per buffer: a framework allocation costs a few microseconds of host time each.

    The fast paths allocate it for the stream they launch on (the framework's current
    stream, or ``stream=``'s: torch from that stream's pool, CuPy the driver's stream-ordered
    memory there) and drop it once the launches are queued, as the general path does: the
    allocators hand the memory out again only in that stream's order."""
    if not variant.scratch:
        return None
    spans, total = [], 0
    for alloc in variant.scratch:
        spans.append((alloc.slot, total))
        total += -(-allocations[alloc.name].nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
    return total, tuple(spans)


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def lazy_view_checks(tensor_index: list[int], key: tuple, complex_in: set[int],
                     out_shapes: tuple, complex_out: list[bool]) -> tuple[tuple[int, ...], bool]:
    """Which tensors of a call with these shapes may be torch's lazy views, whose memory does
    not hold their values: a ``conj()`` of a complex tensor (the conjugate bit; contiguous,
    same pointer) or the ``.imag`` of one (the negative bit). A kernel reading the memory
    would see the unconjugated values, so such tensors go to the general path, which refuses
    them (arrays.TorchAdapter.read). Asking costs two method calls per tensor, so the fast
    paths ask only where a lazy view can pass their other checks: every complex tensor, and
    a real one with a single element (a real negative view of more elements is the strided
    ``.imag`` of a complex tensor, which their contiguity check already sends away; only
    torch's private ``_neg_view`` makes a contiguous one).

    Returns the argument positions to ask, and whether the ``out=`` arrays must be asked
    (every one of them, when any output is complex or has a single element)."""
    views = tuple(i for i, shape in zip(tensor_index, key)
                  if i in complex_in or _numel(shape) == 1)
    view_out = any(c or _numel(shape) == 1 for c, shape in zip(complex_out, out_shapes))
    return views, view_out


#: flag on an :func:`out_overlap` span's size: the program writes that argument (role inout),
#: so a single ``out=`` may not share any of its bytes, not even as the very same array
WRITTEN_SPAN = 1 << 63


def out_overlap(in_spans: list[tuple[int, int]], key: tuple, out_nbytes: int,
                written: list[bool] | None = None) -> tuple[int, tuple[tuple[int, int], ...]]:
    """What a single ``out=`` of ``out_nbytes`` is checked against per call: ``(out_nbytes,
    ((value slot, nbytes), ...))`` of the non-empty tensor inputs (``in_spans``: their slots
    and element sizes, ``key``: their shapes first), ``nbytes`` carrying :data:`WRITTEN_SPAN`
    for the inputs ``written`` marks (written ones, and those the call must read from a copy
    when ``out=`` is the very same memory). A call whose ``out=`` partially overlaps one, or
    shares memory with a marked one (:func:`out_overlaps_input`), goes to the general path,
    which refuses it or reads the input from a copy
    (:func:`~.aliasing.inputs_to_copy_for_outputs`); the fast paths then compare a few
    integers per input, only in calls with ``out=``. ``(0, ())`` when ``out=`` is empty."""
    if not out_nbytes:
        return 0, ()
    flags = written or [False] * len(in_spans)
    spans = zip(in_spans, _input_nbytes(in_spans, key), flags)
    return out_nbytes, tuple((slot, nbytes | (WRITTEN_SPAN if w else 0))
                             for (slot, _), nbytes, w in spans if nbytes)


def _input_nbytes(in_spans: list[tuple[int, int]], key: tuple) -> list[int]:
    """The tensor inputs' sizes in bytes (``in_spans``: their slots and element sizes,
    ``key``: their shapes first)."""
    return [itemsize * math.prod(shape) for (_, itemsize), shape in zip(in_spans, key)]


def out_overlaps_input(vals: list, out_ptr: int,
                       overlap: tuple[int, tuple[tuple[int, int], ...]]) -> bool:
    """Whether a single ``out=`` at ``out_ptr`` partially overlaps a tensor input, or shares
    memory with one the program writes (``vals``: the call's value slots; ``overlap``: the
    entry's :func:`out_overlap`). The torch and CuPy fast paths then hand the call to the
    general path, which refuses it or reads that input from a copy."""
    out_nbytes, spans = overlap
    return any(conflicts(out_ptr, out_nbytes, vals[slot], value & ~WRITTEN_SPAN,
                         bool(value & WRITTEN_SPAN)) for slot, value in spans)


def outs_conflict(vals: list, out_slots: Sequence[int],
                  overlaps: Sequence[tuple[int, tuple[tuple[int, int], ...]]]) -> bool:
    """Whether several ``out=`` arrays, their pointers already in ``vals`` at
    ``out_slots``, must go to the general path: one conflicts with an input as
    :func:`out_overlaps_input` says (``overlaps``: the entry's per-output
    :func:`out_overlap`), or two share a byte (the general path refuses that:
    :func:`~.aliasing.check_disjoint_outputs`). Empty outputs share nothing."""
    ptrs = [vals[slot] for slot in out_slots]
    for p, overlap in zip(ptrs, overlaps):
        if out_overlaps_input(vals, p, overlap):
            return True
    for a in range(len(ptrs)):
        for b in range(a + 1, len(ptrs)):
            na, nb = overlaps[a][0], overlaps[b][0]
            if na and nb and conflicts(ptrs[a], na, ptrs[b], nb, True):
                return True
    return False


def written_pairs(in_spans: list[tuple[int, int]], written: list[bool], key: tuple,
                  names: Sequence[str] = (), refused: Collection[tuple[str, str]] = ()
                  ) -> tuple[tuple[int, int, int, int, bool], ...]:
    """The tensor-argument pairs a call must check for shared memory, as ``(value slot a,
    nbytes a, value slot b, nbytes b, any shared byte conflicts)``: each non-empty argument
    the program writes (``written``: role inout) against every other non-empty one
    (``in_spans`` and ``key``'s shapes as in :func:`out_overlap`); any shared byte conflicts
    when ``b`` is written too, or when ``a`` may not be in place over ``b``
    (``(names[a], names[b])`` in ``refused``: see
    :meth:`~.binding.BoundSummary.in_place_refused`). A call where one conflicts
    (:func:`written_conflict`) goes to the general path, which refuses it or reads ``b`` from
    a copy (:func:`~.aliasing.inputs_to_copy_for_written`). Empty for programs without inout
    arguments, whose calls check nothing."""
    sizes = _input_nbytes(in_spans, key)
    pairs = []
    for i, ((slot, _), n) in enumerate(zip(in_spans, sizes)):
        if not written[i] or not n:
            continue
        for j, ((other, _), m) in enumerate(zip(in_spans, sizes)):
            if j != i and m and not (written[j] and j < i):  # a written pair once
                pairs.append((slot, n, other, m, written[j] or (
                    bool(refused) and (names[i], names[j]) in refused)))
    return tuple(pairs)


def written_conflict(vals: list, pairs: tuple[tuple[int, int, int, int, bool], ...]) -> bool:
    """Whether the call's arguments (``vals``: its value slots) share memory as one of
    :func:`written_pairs` may not: any byte when both are written, else all but the very
    same range (in-place use)."""
    return any(conflicts(vals[a], na, vals[b], nb, both) for a, na, b, nb, both in pairs)


def keyed_symbols(bs: Any) -> set[str]:
    """The caller's integer scalars that key a launch entry: those an expression reads (a
    dim's name included, so that a scalar that must equal a dim is still checked). Another
    integer (a seed, a step counter) is only written to its slot: keying entries on it made
    every new value miss the caches and plan again (about 5-20 µs a call, and caches that
    were cleared every 256 values)."""
    from .._plan_fast import symbols_read

    return symbols_read(bs.summary)


# A finite float at least this large in magnitude rounds to infinity as a float32 (FLT_MAX
# plus half its last place: the tie rounds to the even neighbour, infinity).
FLOAT32_OVERFLOW = 2.0 ** 128 - 2.0 ** 103


def _float32_slots(bs: Any, fast: list[bool]) -> set[int]:
    """The value-list positions that some launch of a fast variant (``fast``: per variant,
    :attr:`FastCore.fast`) packs as float32."""
    out: set[int] = set()
    for v, taken in zip(bs.variants, fast):
        if taken:
            for ls in v.launches:
                out.update(pos for pos, code in zip(ls.order, ls.layout.format.lstrip("@"))
                           if code == "f")
    return out


def split_scalars(bp: Any, core: FastCore) -> tuple[tuple, tuple]:
    """The caller's scalars as ``floats`` ``(argument index, value slot, packed as float32)``
    and ``ints`` ``(argument index, value slot, lowest, highest, keys the entry)`` (``fits``
    admits no other kind; the last field from ``core.keyed``, :func:`keyed_symbols` of the
    program). A float packed as float32 that is finite but :data:`FLOAT32_OVERFLOW` or more
    in magnitude goes to the general path, which refuses it: native-mode ``struct`` packs it
    as infinity without a word."""
    floats, ints = [], []
    keyed = core.keyed
    f32 = _float32_slots(bp.bound, core.fast)
    for i, s in enumerate(bp.bound.inputs):
        if s.is_tensor:
            continue
        rng = bp._ranges[i]
        if rng is None:
            pos = bp._nbuf + s.slot
            floats.append((i, pos, pos in f32))
        else:
            ints.append((i, bp._nbuf + s.slot, rng[0], rng[1], s.is_symbol and s.name in keyed))
    return tuple(floats), tuple(ints)


def make_fast_path(bp: Any, slow: Call) -> tuple[Call | None, frozenset[str]]:
    """A ``call(args, out, stream)`` for the frameworks imported by now, and the names of the
    frameworks tried (so a framework imported later triggers a rebuild); (None, every name)
    when the program does not fit a fast path at all.

    With both frameworks the paths are chained: the torch path's fallback is the cupy path,
    whose fallback is ``slow``. Each path checks every argument's type itself, so a torch call
    pays nothing for cupy's presence, and a cupy call one failed type check."""
    if not fits(bp.bound):
        return None, frozenset(("torch", "cupy"))  # never: do not try again
    names: set[str] = set()
    path: Call | None = None
    torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
    if cupy is not None:
        from .fast_cupy import cupy_path

        names.add("cupy")
        path = cupy_path(bp, slow, cupy)
    if torch is not None:
        from .fast_torch import torch_path

        names.add("torch")
        path = torch_path(bp, path or slow, torch) or path
    return path, frozenset(names)
