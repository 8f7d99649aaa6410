"""The PyTorch and CuPy fast paths in C: builds a ``_launch.FastCall`` for one program.

:mod:`.fast_torch`'s closure spends most of a small launch's host time in the interpreter
between torch's attribute reads (about 3 µs around a 3.5 µs driver call on an H200 host).
``FastCall`` (``runtime/_fastcall.c``) makes the same reads and checks in C and packs the
parameter block on its stack. It decides nothing the closure does not: whatever depends on a
shape comes from here, once per distinct key (:meth:`Hooks.entry`, from the planner's plan
through :meth:`FastCore.plan`), and every call that does not fit goes to the same fallback
before anything is allocated or launched.

It is used only with the C launcher (:mod:`.native`), and only for programs whose layout it
can take (value slots, launches and parameter blocks within its limits; each parameter a
tensor pointer, or a caller's scalar of a matching kind); otherwise the closure is used.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from .arrays import check_stream_device
from .fastpath import Call, FastCore

__all__ = ["Hooks", "native_torch_call", "native_cupy_call", "exchange_api", "dl_dtype"]

_INT64 = (-(1 << 63), (1 << 63) - 1)


class Hooks:
    """What ``FastCall`` asks Python for: per key the launch entry, output allocation for
    shapes no input has and for ``stream=`` (CuPy's: for ``stream=`` only, ``FastCall`` makes
    the others itself), a call's scratch (``scratch(nbytes, device)`` for the current stream,
    ``scratch(nbytes, device, handle)`` for ``stream=``'s raw handle: one array of the
    framework), the context check, the launch error, and the fallback.

    ``context_was_lost(st)`` is :meth:`FastCore.context_was_lost`: asked before a launch on a
    default stream whose context the thread has not confirmed, and after a failed launch on a
    remembered one (true: it was set again, launch once more); when it answers
    :data:`~.device.PUSHED`, ``pop_context(st)`` follows the launches."""

    __slots__ = ("core", "slow", "allocate", "scratch", "_stream_handle", "context_was_lost",
                 "pop_context", "_nvals", "_sizes")

    def __init__(self, core: FastCore, slow: Call, allocate: Callable[..., Any] | None,
                 scratch: Callable[..., Any], stream_handle: Callable[[Any], int],
                 nvals: int) -> None:
        self.core = core
        self.slow = slow
        self.allocate = allocate
        self.scratch = scratch
        self._stream_handle = stream_handle
        self.context_was_lost = core.context_was_lost
        self.pop_context = core.pop_context
        self._nvals = nvals
        self._sizes = [size for size, _ in core.layouts]

    def stream_handle(self, stream: Any, device: Any) -> int:
        """``stream=``'s raw handle; a torch/cupy stream of another device than the tensors'
        is the general path's LaunchError (:func:`~.arrays.check_stream_device`). The handle
        is read first, as the general path does: a stream object with no valid handle is its
        error, whatever device it names (review 72a)."""
        handle = self._stream_handle(stream)
        if isinstance(device, int):
            check_stream_device(self.core.name, stream, device)
        return handle

    def entry(self, key: tuple) -> tuple | None:
        """``(output shapes, likes, launches, views, view_out, overlap, scratch, pairs)`` for
        ``key``, each launch ``(j, gx, gy, gz, bx, by, bz, shared_mem, template)`` where
        ``template`` is the parameter block with the planner's computed values in place (the
        call writes the rest); ``views`` / ``view_out``: the arguments (and whether ``out=``)
        to ask for torch's lazy views (:func:`~.fastpath.lazy_view_checks`); ``overlap``: what
        a single ``out=`` must not partially overlap (:func:`~.fastpath.out_overlap`), with
        several outputs one such pair per output (:func:`~.fastpath.outs_conflict`);
        ``scratch``: :func:`~.fastpath.scratch_layout`'s ``(nbytes, ((slot, offset), ...))``
        or None; ``pairs``: the arguments that may not share memory
        (:func:`~.fastpath.written_pairs`). None when the key's calls go to the general path
        (:meth:`FastCore.plan`) or a computed value does not fit its parameter (the general
        path then explains); ``FastCall`` remembers that per key."""
        core = self.core
        entry = core.cache.get(key)
        if entry is None:
            entry = core.plan(key)
        if not entry:
            return None
        fills, shapes, todo, likes, _, views, view_out, overlap, scratch, pairs = entry
        vals: list[Any] = [0] * self._nvals
        if fills is not None:
            vals[core.fill_from:] = fills
        launches = []
        for getter, pack, j, gx, gy, gz, bx, by, bz, smem in todo:
            block = bytearray(self._sizes[j])
            try:
                pack(block, 0, *(vals if getter is None else getter(vals)))
            except (struct.error, OverflowError, TypeError):
                return None
            launches.append((j, gx, gy, gz, bx, by, bz, smem, bytes(block)))
        return shapes, likes, tuple(launches), views, view_out, overlap, scratch, pairs

    def launch_failed(self, err: int, j: int, gx: int, gy: int, gz: int, bx: int, by: int,
                      bz: int, smem: int) -> None:
        exc = self.core.launch_error(err, j, (gx, gy, gz), (bx, by, bz), smem)
        try:  # the local would tie the error's traceback (and the call's outputs) in a cycle
            raise exc from exc.__cause__
        finally:
            del exc


def _layouts(bp: Any, core: FastCore) -> tuple | None:
    """Per launch (every variant's, in :class:`FastCore`'s order) ``(size, offsets, dynamic)``
    where ``dynamic`` lists ``(offset, struct code, value slot)`` of the parameters a call
    writes (none for a variant the fast paths do not take: no entry launches those); None
    when a launch's parameters are beyond ``FastCall`` (see :class:`~.binding.LaunchSpec`)."""
    out: list[tuple[Any, tuple[Any, ...], tuple[Any, ...]]] = []
    fill_from = core.fill_from
    for variant, fast in zip(bp.bound.variants, core.fast):
        for ls in variant.launches:
            if not fast:
                out.append((ls.size, tuple(ls.offsets), ()))
                continue
            codes = ls.layout.format.lstrip("@")
            if len(codes) != len(ls.order):
                return None
            dynamic = tuple((off, code, v) for off, code, v in zip(ls.offsets, codes, ls.order)
                            if v < fill_from)
            out.append((ls.size, tuple(ls.offsets), dynamic))
    return tuple(out)


def native_torch_call(bp: Any, core: FastCore, slow: Call, torch: Any,
                      tensors: list[tuple[int, int, Any]], floats: tuple, ints: tuple,
                      allocate: Callable[..., Any], scratch: Callable[..., Any],
                      stream_handle: Callable[[Any], int]) -> Call | None:
    """The C fast ``call(args, out, stream)`` for torch tensors, or None when the process
    launches through cuda.bindings, the extension is missing, or the program's layout is
    beyond what ``FastCall`` takes (the caller then uses the closure). Where torch has DLPack's
    C exchange API, FastCall reads each tensor with one C call of torch's (its pointer, device,
    dtype, shape and strides) instead of five attribute reads, and torch's current stream too
    (:func:`exchange_api`)."""
    return _native_call(bp, core, slow, (torch.Tensor, torch.empty_like,
                                         torch._C._cuda_getCurrentRawStream),
                        tensors, floats, ints, allocate, scratch, stream_handle,
                        ("torch", None, exchange_api(torch.Tensor, bp.bound)))


# DLPack's type codes (kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool)
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


def dl_dtype(dtype: Any) -> tuple[int, int]:
    """A kernelpack dtype as DLPack names it: ``(type code, bits)``."""
    code = 4 if dtype.name == "bfloat16" else _DL_CODES[dtype.kind]
    return code, 8 * dtype.itemsize


def exchange_api(tensor_type: type, bs: Any) -> tuple | None:
    """What ``FastCall`` takes to read ``tensor_type``'s tensors through DLPack's C exchange
    API: ``(the type's __dlpack_c_exchange_api__ capsule, the tensors' and the outputs'
    DLPack dtypes)``; None where the type has none or ``KERNELPACK_TORCH_EXCHANGE_API=0``.
    (FastCall itself checks the API's version and functions, and keeps the attribute reads
    for one it cannot use.)"""
    from .. import config

    api = getattr(tensor_type, "__dlpack_c_exchange_api__", None)
    if api is None or type(api).__name__ != "PyCapsule" or not config.torch_exchange_api():
        return None
    return (api, tuple(dl_dtype(s.dtype) for s in bs.inputs if s.is_tensor),
            tuple(dl_dtype(o.dtype) for o in bs.outputs))


def native_cupy_call(bp: Any, core: FastCore, slow: Call, cupy: Any,
                     tensors: list[tuple[int, int, Any]], floats: tuple, ints: tuple,
                     allocate: Callable[..., Any], scratch: Callable[..., Any],
                     stream_handle: Callable[[Any], int]) -> Call | None:
    """The same for cupy arrays (``FastCall`` reads ``dtype``, ``shape``, ``_c_contiguous``
    and ``data.ptr`` / ``data.device_id``, asks CuPy's current device and stream per call,
    and makes outputs as ``cupy.ndarray(shape, dtype)``: no empty_like; the allocate hook
    only for ``stream=``'s outputs, from that stream's arena), or None where it cannot be
    used; a CuPy without the stored ``_c_contiguous`` flag keeps the closure."""
    if not hasattr(cupy.ndarray, "_c_contiguous"):
        return None
    return _native_call(bp, core, slow, (cupy.ndarray, None, cupy.cuda.get_current_stream),
                        tensors, floats, ints, allocate, scratch, stream_handle,
                        ("cupy", cupy.cuda.runtime.getDevice, None))


def _native_call(bp: Any, core: FastCore, slow: Call, framework: tuple,
                 tensors: list[tuple[int, int, Any]], floats: tuple, ints: tuple,
                 allocate: Callable[..., Any] | None, scratch: Callable[..., Any],
                 stream_handle: Callable[[Any], int], flavor: tuple) -> Call | None:
    """``FastCall(*framework, hooks, ..., *flavor, scratch slots).call``; framework: (array
    type, empty_like or None, current-stream accessor); flavor: ("torch", None, exchange API)
    or ("cupy", current-device getter, None)."""
    from .native import launcher

    if not launcher().native:
        return None
    try:
        from ._launch import FastCall
    except ImportError:
        return None
    fill_from = core.fill_from
    layouts = _layouts(bp, core)
    if layouts is None:
        return None
    ints_c = tuple((i, slot, max(lo, _INT64[0]), min(hi, _INT64[1]), bool(sym))
                   for i, slot, lo, hi, sym in ints)
    hooks = Hooks(core, slow, allocate, scratch, stream_handle, bp._nvals)
    scratch_slots = tuple(sorted({a.slot for v, fast in zip(bp.bound.variants, core.fast)
                                  if fast for a in v.scratch}))
    try:
        fast = FastCall(*framework, hooks, bp._states, len(bp.bound.inputs),
                        tuple(tensors), tuple((i, slot) for i, slot, _ in floats), ints_c,
                        tuple((slot, tok) for slot, _, tok in core.outputs), fill_from,
                        layouts, core.trust_context, *flavor, scratch_slots)
    except ValueError:  # beyond FastCall's limits (it says which): the closure takes it
        return None
    return fast.call
