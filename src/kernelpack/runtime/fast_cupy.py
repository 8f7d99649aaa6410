"""The CuPy fast path: ``cupy.ndarray`` in, ``cupy.ndarray`` out, in one closure.

The same steps as :mod:`.fast_torch` through CuPy's attributes (``data.ptr``,
``data.device_id``, NumPy dtypes compared by identity, then equality); CuPy allocates on its
current device, so a call whose arrays are on another device takes the general path, which
switches devices itself.

Contiguity is read from ``ndarray._c_contiguous`` where CuPy has it (a stored flag of its
array type): the public ``flags.c_contiguous`` builds a ``Flags`` object on every read, which
costs more than the rest of an argument's checks.

With the C launcher, the same steps run in C (:func:`.fast_native.native_cupy_call`, the
PyTorch path's ``FastCall`` reading CuPy's attributes); the closure below is the fallback.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

from .arrays import _PoolBlock, cupy_adapter, stream_device, stream_handle
from .fast_native import native_cupy_call
from .fastpath import (FLOAT32_OVERFLOW, Call, FastCore, out_overlaps_input, outs_conflict,
                       split_scalars, written_conflict)

INF = float("inf")

__all__ = ["cupy_path"]


def _ordered_scratch(cupy: Any, nbytes: int, stream: int, name: str) -> Any:
    """Scratch for a call on ``stream`` as a uint8 cupy array of stream-ordered memory of the
    driver's, freed on that stream when the array goes (after the launches are queued).
    Taken while the stream is captured into a CUDA graph: the capture records the allocation
    and the free as graph nodes, so that every replay has its own (memory of CuPy's pool went
    back to the pool when the captured call returned, and the next array allocated on that
    stream got it while every replay of the graph still wrote its partial sums there). And
    for ``stream=``, another stream than CuPy's current one, as the general path's scratch is
    (:func:`~.execute._temporary`): CuPy's pool orders a block on the current stream only.
    ``name``: the program's, for a failed allocation's message."""
    from . import driver as _drv
    from .execute import cu_stream

    cs = cu_stream(stream)
    size = max(nbytes, 1)
    drv = _drv.bindings()
    # the owner that CuPy's UnownedMemory keeps, made before the allocation so that it alone
    # frees it, once, on its stream (review 62: an except clause beside an owner made after
    # the allocation freed it twice when a KeyboardInterrupt came as the owner was made)
    owner = _PoolBlock(functools.partial(_drv.free_ordered, drv, cs))
    ptr = _drv.allocate_ordered(drv, size, cs, owner.held,
                                f"{name}: allocating a call's scratch (stream-ordered)")
    memory = cupy.cuda.UnownedMemory(ptr, size, owner)
    return cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))


def _misaligned(dtype: Any) -> int:
    """The pointer bits an array of NumPy ``dtype`` must have clear (its element's alignment,
    a complex one's part's, less one): a cupy view can be misaligned, and a kernel faults on
    it, poisoning the context."""
    return (dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize) - 1


def cupy_path(bp: Any, slow: Call, cupy: Any) -> Call | None:
    """The fast ``call(args, out, stream)`` for cupy arrays, or None for programs with a
    dtype NumPy lacks (bfloat16)."""
    import numpy

    bs = bp.bound
    try:
        tok = {s.name: numpy.dtype(s.dtype.name) for s in (*bs.inputs, *bs.outputs)
               if getattr(s, "is_tensor", True)}
    except TypeError:  # bfloat16: no NumPy dtype
        return None
    core = FastCore(bp, [tok[o.name] for o in bs.outputs],
                    {i: tok[s.name] for i, s in enumerate(bs.inputs) if s.is_tensor})
    ndarray, empty, empty_like = cupy.ndarray, cupy.empty, cupy.empty_like
    contiguous = operator.attrgetter("_c_contiguous" if hasattr(ndarray, "_c_contiguous")
                                     else "flags.c_contiguous")
    current_stream, get_device = cupy.cuda.get_current_stream, cupy.cuda.runtime.getDevice
    tensors = [(i, s.slot, tok[s.name]) for i, s in enumerate(bs.inputs) if s.is_tensor]
    first_i, first_slot, first_dt = tensors[0]
    rest = tuple((i, slot, dt, _misaligned(dt)) for i, slot, dt in tensors[1:])
    first_bits = _misaligned(first_dt)
    floats, ints = split_scalars(bp, core)
    outputs = tuple(core.outputs)
    single_out = len(outputs) == 1
    out_slot, _, out_dt = outputs[0] if outputs else (0, None, None)
    out_bits = _misaligned(out_dt) if out_dt is not None else 0
    # several outputs: each out= array's slot, dtype and pointer bits that must be 0
    out_checks = tuple((slot, dt, _misaligned(dt)) for slot, _, dt in outputs)
    out_slots = tuple(slot for slot, _, _ in outputs)
    several_out = len(outputs) > 1
    n_in, nvals, states = len(bs.inputs), bp._nvals, bp._states
    cache, plan, fill_from = core.cache, core.plan, core.fill_from
    fire = core.fire

    uint8 = numpy.uint8
    is_capturing = getattr(cupy.cuda.Stream, "is_capturing", None)

    def allocate_scratch(nbytes: int, device: int, stream: int | None = None) -> Any:
        """A call's scratch (:func:`~.fastpath.scratch_layout`): CuPy's current device is
        the arrays' (checked per call), its current stream the one the call launches on.
        While that stream is captured into a CUDA graph, or for ``stream=``'s raw handle
        ``stream``: :func:`_ordered_scratch`."""
        if stream is not None:
            return _ordered_scratch(cupy, nbytes, stream, bp.name)
        current = current_stream()
        if is_capturing is not None and is_capturing(current):
            return _ordered_scratch(cupy, nbytes, current.ptr, bp.name)
        return empty(nbytes, dtype=uint8)

    # stream='s outputs (the hook gets its raw handle): each from that stream's arena of
    # CuPy's pool, as the general path allocates them; without stream= the outputs are made
    # on CuPy's current stream, in C or below, without this hook
    allocate = cupy_adapter(cupy).array_on

    native = native_cupy_call(bp, core, slow, cupy, tensors, floats, ints, allocate,
                              allocate_scratch, stream_handle)
    if native is not None:
        return native

    def handle_for(stream: Any, device: int, scratch: Any) -> int | None:
        """``stream=``'s raw handle, or None where the general path takes the call: a CuPy
        stream of another device (it refuses it), or scratch on a default stream (the
        driver's stream-ordered scratch there needs the device's context current, which the
        general path makes so)."""
        if stream_device(stream) not in (None, device):
            return None
        sh = stream_handle(stream)
        return None if scratch is not None and sh < 3 else sh

    def call(args: Any, out: Any, stream: Any) -> Any:
        if len(args) != n_in:
            return slow(args, out, stream)
        vals: list[Any] = [0] * nvals
        a = args[first_i]
        if (a.__class__ is not ndarray or (dty := a.dtype) is not first_dt and dty != first_dt
                or not contiguous(a)):
            return slow(args, out, stream)
        mem = a.data
        device = mem.device_id
        key = [a.shape]
        if (p := mem.ptr) & first_bits:  # a misaligned view: the general path refuses it
            return slow(args, out, stream)
        vals[first_slot] = p
        for i, slot, dt, bits in rest:
            a = args[i]
            if (a.__class__ is not ndarray or (dty := a.dtype) is not dt and dty != dt
                    or not contiguous(a)):
                return slow(args, out, stream)
            mem = a.data
            if mem.device_id != device or (p := mem.ptr) & bits:
                return slow(args, out, stream)
            key.append(a.shape)
            vals[slot] = p
        for i, pos, f32 in floats:
            v = args[i]
            if v.__class__ is not float or f32 and FLOAT32_OVERFLOW <= abs(v) < INF:
                return slow(args, out, stream)  # (the general path refuses a float32 overflow)
            vals[pos] = v
        for i, pos, lo, hi, is_symbol in ints:
            v = args[i]
            if v.__class__ is not int or not lo <= v <= hi:
                return slow(args, out, stream)
            if is_symbol:
                key.append(v)
            vals[pos] = v
        st = states.get(device)
        k = tuple(key)
        entry = cache.get(k)
        if entry is None:
            entry = plan(k)
        if not entry or st is None or get_device() != device:
            return slow(args, out, stream)  # the general path switches devices itself
        # no lazy views in CuPy
        fills, shapes, todo, likes, one, _, _, overlap, scratch, pairs = entry
        if pairs and written_conflict(vals, pairs):  # the general path refuses it
            return slow(args, out, stream)
        if fills is not None:
            vals[fill_from:] = fills
        sh = None
        if out is None and stream is not None:  # the handle first: outputs from its arena
            if (sh := handle_for(stream, device, scratch)) is None:
                return slow(args, out, stream)
        if out is None:
            made = []
            for (slot, _, dt), shape, like in zip(outputs, shapes, likes):
                a = (allocate(shape, dt, device, sh) if sh is not None
                     else empty_like(args[like]) if like >= 0 else empty(shape, dtype=dt))
                vals[slot] = a.data.ptr
                made.append(a)
            ret = made[0] if single_out else (tuple(made) if made else None)
        elif single_out and out.__class__ is ndarray:
            mem = out.data
            if ((dty := out.dtype) is not out_dt and dty != out_dt or mem.device_id != device
                    or not contiguous(out) or out.shape != shapes[0] or mem.ptr & out_bits):
                return slow(args, out, stream)
            o = vals[out_slot] = mem.ptr
            if out_overlaps_input(vals, o, overlap):  # the general path refuses it
                return slow(args, out, stream)
            ret = out
        elif several_out and out.__class__ is tuple and len(out) == len(outputs):
            for o, (slot, dt, bits), shape in zip(out, out_checks, shapes):
                if o.__class__ is not ndarray:
                    return slow(args, out, stream)
                mem = o.data
                if ((dty := o.dtype) is not dt and dty != dt or mem.device_id != device
                        or not contiguous(o) or o.shape != shape or mem.ptr & bits):
                    return slow(args, out, stream)
                vals[slot] = mem.ptr
            if outs_conflict(vals, out_slots, overlap):  # the general path refuses it
                return slow(args, out, stream)
            ret = out
        else:
            return slow(args, out, stream)
        if stream is None:
            sh = current_stream().ptr
        elif sh is None and (sh := handle_for(stream, device, scratch)) is None:
            return slow(args, out, stream)  # (with out=: the handle is taken here)
        if scratch is not None and scratch[0]:  # one buffer for all, alive until queued
            total, spans = scratch
            buf = allocate_scratch(total, device, None if stream is None else sh)
            base = buf.data.ptr
            for slot, offset in spans:
                vals[slot] = base + offset
        return ret if fire(st, device, sh, one, todo, vals) else slow(args, out, stream)

    return call
