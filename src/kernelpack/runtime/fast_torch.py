"""The PyTorch fast path: ``torch.Tensor`` in, ``torch.Tensor`` out, in one closure.

Per call it reads, for each tensor, its type, dtype (identity with the expected ``torch``
dtype), contiguity, device and shape, and its pointer; looks the shapes up in the plan cache;
allocates or checks the output; writes this thread's parameter blocks and launches. The launch
part is written out here rather than called (one Python call is a measurable part of a
launch); the rare paths live in :class:`~kernelpack.runtime.fastpath.FastCore`. Anything that
does not fit goes to the general path before anything is launched (see :mod:`.fastpath`).

With the C launcher the same path runs in C instead (:mod:`.fast_native`); this closure is
what runs without the extension, and for programs beyond the C path's limits.
"""

from __future__ import annotations

from typing import Any

from .arrays import stream_device, stream_handle, torch_adapter
from .fast_native import native_torch_call
from .fastpath import (FLOAT32_OVERFLOW, Call, FastCore, out_overlaps_input, outs_conflict,
                       split_scalars, written_conflict)

INF = float("inf")

__all__ = ["torch_path"]


def torch_path(bp: Any, slow: Call, torch: Any) -> Call | None:
    """The fast ``call(args, out, stream)`` for torch tensors, or None when this torch lacks
    what it needs (a dtype of the program, the raw current-stream accessor)."""
    bs = bp.bound
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    tok = {s.name: getattr(torch, s.dtype.name, None) for s in (*bs.inputs, *bs.outputs)
           if getattr(s, "is_tensor", True)}
    if raw_stream is None or None in tok.values():
        return None
    core = FastCore(bp, [tok[o.name] for o in bs.outputs],
                    {i: tok[s.name] for i, s in enumerate(bs.inputs) if s.is_tensor})
    Tensor, empty, empty_like, make_device = torch.Tensor, torch.empty, torch.empty_like, \
        torch.device
    tensors = [(i, s.slot, tok[s.name]) for i, s in enumerate(bs.inputs) if s.is_tensor]
    first_i, first_slot, first_dt = tensors[0]
    rest = tuple(tensors[1:])
    floats, ints = split_scalars(bp, core)
    outputs = tuple(core.outputs)
    single_out = len(outputs) == 1
    out_slot, _, out_dt = outputs[0] if outputs else (0, None, None)
    out_slots = tuple(slot for slot, _, _ in outputs)
    several_out = len(outputs) > 1
    n_in, nvals, states = len(bs.inputs), bp._nvals, bp._states
    cache, plan, fill_from = core.cache, core.plan, core.fill_from
    fire = core.fire
    devices: dict[int, Any] = {}

    def device_of(device: int) -> Any:
        dev = devices.get(device)
        if dev is None:
            dev = devices[device] = make_device("cuda", device)
        return dev

    adapter = torch_adapter(torch)

    def allocate(shape: tuple, dt: Any, device: int, stream: int | None = None) -> Any:
        """An output not shaped like any input (those use ``empty_like``, the cheapest form
        measured; sizes as separate ints parse faster than a tuple); with ``stream=`` (its raw
        handle ``stream``) every output, from that stream's pool, as the general path
        allocates it (:meth:`~.arrays.TorchAdapter.tensor_on`)."""
        if stream is not None:
            return adapter.tensor_on(shape, dt, device, stream)
        dev = device_of(device)
        return empty(*shape, dtype=dt, device=dev) if shape else empty((), dtype=dt, device=dev)

    def allocate_scratch(nbytes: int, device: int, stream: int | None = None) -> Any:
        """A call's scratch (:func:`~.fastpath.scratch_layout`), from the pool of the stream
        the call launches on (the device's current stream, or ``stream=``'s raw handle
        ``stream``: a block of another stream's pool may still be in use by work queued
        there), through the general path's own adapter (:func:`~.arrays.torch_adapter`),
        which takes it from torch's caching allocator without a tensor."""
        return adapter.scratch(nbytes, device, raw_stream(device) if stream is None else stream)[0]

    native = native_torch_call(bp, core, slow, torch, tensors, floats, ints, allocate,
                               allocate_scratch, stream_handle)
    if native is not None:
        return native

    def call(args: Any, out: Any, stream: Any) -> Any:
        if len(args) != n_in:
            return slow(args, out, stream)
        vals: list[Any] = [0] * nvals
        t = args[first_i]
        try:  # a sparse or mkldnn tensor raises in is_contiguous() / data_ptr(): no strides
            if t.__class__ is not Tensor or t.dtype is not first_dt or not t.is_contiguous():
                return slow(args, out, stream)
            device = t.get_device()  # host tensors (-1) have no state: see ``st`` below
            key = [t.shape]
            vals[first_slot] = t.data_ptr()
            for i, slot, dt in rest:
                t = args[i]
                if (t.__class__ is not Tensor or t.dtype is not dt or not t.is_contiguous()
                        or t.get_device() != device):
                    return slow(args, out, stream)
                key.append(t.shape)
                vals[slot] = t.data_ptr()
        except Exception:  # noqa: BLE001 - the general path meets it again and names the
            # parameter (a LaunchError), as FastCall (C) hands such an array over
            return slow(args, out, stream)
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
        if not entry or st is None:  # or a first call on this device (or host memory)
            return slow(args, out, stream)
        fills, shapes, todo, likes, one, views, view_out, overlap, scratch, pairs = entry
        if pairs and written_conflict(vals, pairs):  # the general path refuses it
            return slow(args, out, stream)
        for i in views:  # lazy conjugate/negative views: the general path refuses them
            t = args[i]
            if t.is_conj() or t.is_neg():
                return slow(args, out, stream)
        if fills is not None:
            vals[fill_from:] = fills
        if out is None and stream is not None:  # outputs from that stream's pool
            if stream_device(stream) not in (None, device):  # the general path refuses it
                return slow(args, out, stream)
            sh = stream_handle(stream)
            made = []
            for (slot, _, dt), shape in zip(outputs, shapes):
                o = allocate(shape, dt, device, sh)
                vals[slot] = o.data_ptr()
                made.append(o)
            ret = made[0] if single_out else tuple(made) if made else None
        elif out is None:
            if single_out:
                like = likes[0]
                ret = empty_like(args[like]) if like >= 0 else allocate(shapes[0], out_dt, device)
                vals[out_slot] = ret.data_ptr()
            else:
                made = []
                for (slot, _, dt), shape, like in zip(outputs, shapes, likes):
                    o = empty_like(args[like]) if like >= 0 else allocate(shape, dt, device)
                    vals[slot] = o.data_ptr()
                    made.append(o)
                ret = tuple(made) if made else None
            sh = raw_stream(device)
        elif single_out and out.__class__ is Tensor:
            try:  # a sparse out= raises as a sparse input does (above)
                if (out.dtype is not out_dt or not out.is_contiguous() or out.shape != shapes[0]
                        or out.get_device() != device
                        or view_out and (out.is_conj() or out.is_neg())):
                    return slow(args, out, stream)
                o = vals[out_slot] = out.data_ptr()
            except Exception:  # noqa: BLE001
                return slow(args, out, stream)
            if out_overlaps_input(vals, o, overlap):  # the general path refuses it
                return slow(args, out, stream)
            ret = out
        elif several_out and out.__class__ is tuple and len(out) == len(outputs):
            try:
                for o, (slot, _, dt), shape in zip(out, outputs, shapes):
                    if (o.__class__ is not Tensor or o.dtype is not dt or not o.is_contiguous()
                            or o.shape != shape or o.get_device() != device
                            or view_out and (o.is_conj() or o.is_neg())):
                        return slow(args, out, stream)
                    vals[slot] = o.data_ptr()
            except Exception:  # noqa: BLE001
                return slow(args, out, stream)
            if outs_conflict(vals, out_slots, overlap):  # the general path refuses it
                return slow(args, out, stream)
            ret = out
        else:
            return slow(args, out, stream)
        if out is not None:
            if stream is None:
                sh = raw_stream(device)
            elif stream_device(stream) not in (None, device):  # the general path refuses it
                return slow(args, out, stream)
            else:
                sh = stream_handle(stream)
        if scratch is not None and scratch[0]:  # one buffer for all, alive until queued
            total, spans = scratch
            buf = allocate_scratch(total, device, None if stream is None else sh)
            base = buf.data_ptr()
            for slot, offset in spans:
                vals[slot] = base + offset
        return ret if fire(st, device, sh, one, todo, vals) else slow(args, out, stream)

    return call
