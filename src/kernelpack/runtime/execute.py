"""The second half of a call: evaluate, allocate (or take ``out=``), write slots, launch.

Split from :mod:`.launcher` (which reads and checks the arguments) to keep each module about
one thing. Nothing here allocates when ``out=`` covers every output and the program has no
scratch buffers, so a captured CUDA graph contains only the launches (and memsets of
``zero_init`` outputs).

Error guarantee: every check runs before the first launch is queued; a driver failure on a
launch raises a LaunchError naming the kernel (earlier launches of the same call have been
queued, as with any sequence of CUDA calls).
"""

from __future__ import annotations

import struct
from typing import Any

from ..dtypes import uint8
from ..errors import ConstraintError, KernelPackError, LaunchError
from . import driver as _drv
from ..limits import MAX_LAUNCH_REPEAT
from .arrays import GENERIC, adapter_for
from .binding import ARG_BUFFER, ARG_SCALAR

__all__ = ["run", "cu_stream"]

_drv_mod: Any = None


def _driver() -> Any:
    global _drv_mod
    if _drv_mod is None:
        _drv_mod = _drv.bindings()
    return _drv_mod


def _outputs_in_order(out: Any, outputs: list, program: str) -> list:
    names = [a.name for a in outputs]
    if isinstance(out, dict):
        unknown = set(out) - set(names)
        if unknown:
            raise TypeError(f"{program}: out= names unknown outputs {sorted(unknown)} "
                            f"(outputs: {names})")
        missing = [n for n in names if n not in out]
        if missing:
            raise TypeError(f"{program}: out= lacks output(s) {missing}")
        return [out[n] for n in names]
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(items) != len(names):
        raise TypeError(f"{program}: out= has {len(items)} arrays, the program has "
                        f"{len(names)} outputs {names}")
    return items


def run(bp: Any, st: Any, device: int, sh: int, adapter: Any, syms: list, vals: list,
        shapes: list, scalars: list, out: Any) -> Any:
    bs = bp.bound
    prog = bs.program
    frame = prog.new_frame(syms)
    value = prog.value
    name = bp.name
    try:
        for spec, pname, i, expr, k in bs.dim_checks:
            n = shapes[k][i]
            if value(frame, spec[0], spec[1]) != n:
                raise ConstraintError(f"{name}: {pname}.shape[{i}] is {n}, expected {expr}")
        for spec, message in bs.constraints:
            if not (spec if spec.__class__ is int else value(frame, spec[0], spec[1])):
                raise ConstraintError(f"{name}: constraint failed: {message}")
        for vi, variant in enumerate(bs.variants):
            pred = variant.predicate
            if pred is None or (pred if pred.__class__ is int else value(frame, pred[0], pred[1])):
                break
        else:
            raise ConstraintError(f"{name}: no variant applies")
        out_shapes = []
        for alloc in (*bs.outputs, *variant.scratch):
            shape = tuple(s if s.__class__ is int else value(frame, s[0], s[1])
                          for s in alloc.shape)
            for n in shape:
                if n < 0:
                    raise ConstraintError(f"{name}: {alloc.kind} {alloc.name} has negative "
                                          f"shape {shape}")
            out_shapes.append(shape)
        nbuf = bp._nbuf
        for slot, spec in bs.computed:
            vals[nbuf + slot] = spec if spec.__class__ is int else value(frame, spec[0], spec[1])
    except KernelPackError as exc:
        raise bp._diagnose(shapes, scalars, exc) from None
    n_out = len(bs.outputs)
    memsets: list[tuple[int, int]] = []
    if out is not None:
        results = _outputs_in_order(out, bs.outputs, name)
        for alloc, arr, shape in zip(bs.outputs, results, out_shapes):
            ad = adapter_for(arr)
            ptr, ashape, dt, dev, contiguous = ad.read(arr, alloc.name, sh)
            tok = ad.dtype_token(alloc.dtype)
            if dt is not tok and dt != tok:
                raise LaunchError(f"{name}: out {alloc.name!r} has dtype {ad.dtype_name(dt)}, "
                                  f"expected {alloc.dtype}")
            if tuple(ashape) != shape:
                raise LaunchError(f"{name}: out {alloc.name!r} has shape {tuple(ashape)}, "
                                  f"expected {shape}")
            if dev != device and dev != -2:
                raise LaunchError(f"{name}: out {alloc.name!r} is on device {dev}, the inputs "
                                  f"on device {device}")
            if not contiguous:
                raise LaunchError(f"{name}: out {alloc.name!r} is not C-contiguous")
            vals[alloc.slot] = ptr
            if alloc.zero_init:
                memsets.append((ptr, _nbytes(shape, alloc.dtype.itemsize)))
    else:
        results = []
        for alloc, shape in zip(bs.outputs, out_shapes):
            arr, ptr = adapter.empty(shape, alloc.dtype, device, sh)
            results.append(arr)
            vals[alloc.slot] = ptr
            if alloc.zero_init:
                memsets.append((ptr, _nbytes(shape, alloc.dtype.itemsize)))
    drv = _drv_mod or _driver()
    dev = st.device
    if sh < 3:  # NULL / legacy / per-thread default stream: the current context decides
        err, cur = drv.cuCtxGetCurrent()
        if err or int(cur) != dev.ctx_id:
            dev.make_current()
    cs = _streams.get(sh)
    if cs is None:
        cs = cu_stream(sh)
    keep: list[Any] = []     # framework scratch arrays: alive until the launches are queued
    ordered: list[int] = []  # our own scratch: freed stream-ordered after the launches
    try:
        for alloc, shape in zip(variant.scratch, out_shapes[n_out:]):
            nbytes = _nbytes(shape, alloc.dtype.itemsize)
            if adapter is GENERIC:
                ptr = int(_drv.check(drv.cuMemAllocAsync(max(nbytes, 1), cs),
                                     f"{name}: allocating scratch {alloc.name!r}"))
                ordered.append(ptr)
            else:
                arr, ptr = adapter.empty((nbytes,), uint8, device, sh)
                keep.append(arr)
            vals[alloc.slot] = ptr
            if alloc.zero_init:
                memsets.append((ptr, nbytes))
        _queue(bp, st, vi, variant, frame, vals, cs, memsets, shapes, scalars)
    finally:
        for ptr in ordered:
            drv.cuMemFreeAsync(ptr, cs)
    if n_out == 1:
        return results[0]
    return tuple(results) if n_out else None


def _queue(bp: Any, st: Any, vi: int, variant: Any, frame: list, vals: list, cs: Any,
           memsets: list, shapes: list, scalars: list) -> None:
    """Evaluate and check every (repeated) launch of the variant, then zero-fill and launch
    them in order: a failed check queues nothing."""
    drv = _drv_mod or _driver()
    bs = bp.bound
    prog, value, name = bs.program, bs.program.value, bp.name
    planned = []
    try:
        for ls, func in zip(variant.launches, st.funcs[vi]):
            count = 1
            if ls.count is not None:
                count = ls.count if ls.count.__class__ is int else value(frame, ls.count[0],
                                                                         ls.count[1])
                if not 0 <= count <= MAX_LAUNCH_REPEAT:
                    raise ConstraintError(f"{name}: {ls.kernel} count = {count}, expected "
                                          f"0..{MAX_LAUNCH_REPEAT}")
            for k in range(count):
                f = frame
                if ls.loop_symbol >= 0:
                    f = prog.new_frame(frame[:bs.nsym])
                    f[ls.loop_symbol] = k
                dims = ls.dims or [s if s.__class__ is int else value(f, s[0], s[1])
                                   for s in (*ls.grid, *ls.block, ls.shared_mem)]
                for v in dims:
                    if not 0 <= v < (1 << 32):
                        raise LaunchError(f"{name}: launch of {ls.kernel}: dimensions "
                                          f"{list(dims)} do not fit the driver's unsigned ints")
                if not (dims[0] and dims[1] and dims[2]):
                    continue  # an empty grid: nothing to do (size-0 tensors)
                args = ls.getter(vals) if ls.simple else tuple(_arg_values(bp, ls, f, vals))
                try:
                    ls.layout.pack(*args)  # range check now, before anything is queued
                except (struct.error, OverflowError) as exc:
                    raise LaunchError(f"{name}: an argument of {ls.kernel} does not fit its "
                                      f"parameter ({exc})") from None
                planned.append((ls, func, dims, args))
    except KernelPackError as exc:
        raise bp._diagnose(shapes, scalars, exc) from None
    for ptr, nbytes in memsets:
        if nbytes:
            _drv.check(drv.cuMemsetD8Async(ptr, 0, nbytes, cs), f"{name}: zero-filling an output")
    launch = drv.cuLaunchKernel
    with bp._lock:  # the parameter blocks are shared by every caller of the program
        for ls, func, d, args in planned:
            ls.layout.pack_into(ls.param_buf, 0, *args)
            err, = launch(func, d[0], d[1], d[2], d[3], d[4], d[5], d[6], cs, ls.params_addr, 0)
            if err:
                failure = _drv.error_for(err, f"{name}: launching {ls.kernel} with grid "
                                              f"{tuple(d[:3])} block {tuple(d[3:6])} "
                                              f"shared_mem {d[6]}")
                raise bp._diagnose(shapes, scalars, failure) from failure.__cause__


def _arg_values(bp: Any, ls: Any, frame: list, vals: list) -> list:
    value = bp.bound.program.value
    nbuf = bp._nbuf
    out = []
    for kind, ref in ls.args:
        if kind == ARG_BUFFER:
            out.append(vals[ref])
        elif kind == ARG_SCALAR:
            out.append(vals[nbuf + ref])
        else:
            out.append(ref if ref.__class__ is int else value(frame, ref[0], ref[1]))
    return out


def _nbytes(shape: tuple[int, ...], itemsize: int) -> int:
    n = itemsize
    for d in shape:
        n *= d
    return n


_streams: dict[int, Any] = {}


def cu_stream(handle: int) -> Any:
    """The cached ``CUstream`` object for a raw handle (what ``cuLaunchKernel`` takes)."""
    s = _streams.get(handle)
    if s is None:
        if len(_streams) > 1024:
            _streams.clear()
        s = _streams[handle] = _driver().CUstream(handle)
    return s
