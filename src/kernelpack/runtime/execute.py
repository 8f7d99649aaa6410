"""The second half of a call: allocate (or take ``out=``), write slots, launch a plan.

Split from :mod:`.launcher` (which reads and checks the arguments and asks the planner for
the call's :class:`~kernelpack.planner.Plan`) to keep each module about one thing. Nothing
here allocates when ``out=`` covers every output, the program has no scratch buffers and no
input is read from a copy (:mod:`.aliasing`), so a captured CUDA graph contains only the
launches (and memsets of ``zero_init`` outputs).

Error guarantee: every check runs before the first launch is queued (the summary's checks in
the planner, before this module runs); a driver failure on a
launch raises a LaunchError naming the kernel (earlier launches of the same call have been
queued, as with any sequence of CUDA calls).
"""

from __future__ import annotations

import struct
from typing import Any, Collection, NoReturn, Sequence

from ..errors import KernelPackError, LaunchError
from . import driver as _drv
from .aliasing import check_disjoint_outputs, inputs_to_copy_for_outputs
from .arrays import GENERIC, adapter_for, readonly_why
from .binding import ARG_BUFFER, ARG_SCALAR, fills_of
from .device import PUSHED
from .native import launcher

__all__ = ["run", "cu_stream", "allow_shared", "DEFAULT_SHARED_MEM"]

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
            # sorted by repr: keys of mixed types (None, 1, 'w') do not compare
            raise TypeError(f"{program}: out= names unknown outputs {sorted(unknown, key=repr)} "
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


def run(bp: Any, st: Any, device: int, sh: int, adapter: Any, vals: list, plan: Any,
        out: Any, inputs: Sequence[tuple[int, int, str]] = (),
        copies: Collection[str] = ()) -> Any:
    """Allocate (or take ``out=``), write the slots and launch what ``plan`` says.
    ``inputs``: the tensor inputs' ``(pointer, nbytes, name)``, against which ``out=`` is
    checked (:func:`~.aliasing.inputs_to_copy_for_outputs`); ``copies``: the inputs already
    known to be read from a copy (:func:`~.aliasing.inputs_to_copy_for_written`). Each such
    input is copied on the call's stream into memory of the call, before the zero-fills and
    the launches, which then read the copy.

    The device's context is current while the call allocates and launches; a thread that had
    another device's context current gets it back afterwards (:meth:`.Device.enter`)."""
    # A launch on a default stream runs in the current context, and a DeviceBuffer is
    # allocated in it: those need the device's context; an explicit stream carries its own.
    dev = st.device
    pushed = (sh < 3 or adapter is GENERIC) and dev.enter() == PUSHED
    try:
        return _run(bp, st, device, sh, adapter, vals, plan, out, inputs, copies)
    finally:
        if pushed:
            dev.leave()


def _run(bp: Any, st: Any, device: int, sh: int, adapter: Any, vals: list, plan: Any,
         out: Any, inputs: Sequence[tuple[int, int, str]], copies: Collection[str]) -> Any:
    """:func:`run` with the device's context current."""
    bs = bp.bound
    name = bp.name
    variant = bs.variants[plan.variant]
    if variant.fills:
        fill_from = bs.fill_from
        vals[fill_from:fill_from + len(variant.fills)] = fills_of(variant, plan)
    allocations = plan.allocations
    n_out = len(bs.outputs)
    memsets: list[tuple[int, int]] = []
    if out is not None:
        results = _outputs_in_order(out, bs.outputs, name)
        for alloc, arr in zip(bs.outputs, results):
            planned = allocations[alloc.name]
            shape = planned.shape
            ad = adapter_for(arr)
            ptr, ashape, dt, dev, contiguous = ad.read(arr, alloc.name, sh)
            if dev == -1:
                raise LaunchError(f"{name}: out {alloc.name!r} is in host memory; pass a CUDA "
                                  f"array on device {device}")
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
            why = readonly_why(arr) if ad is GENERIC else None
            if why:
                raise LaunchError(f"{name}: out {alloc.name!r} is read-only ({why})")
            vals[alloc.slot] = ptr
            if alloc.zero_init:
                memsets.append((ptr, planned.nbytes))
        spans = [(vals[a.slot], allocations[a.name].nbytes, a.name) for a in bs.outputs]
        if len(results) > 1:
            check_disjoint_outputs(name, spans)
        if inputs:
            copies = set(copies) | inputs_to_copy_for_outputs(
                name, spans, inputs, {a.name for a in bs.outputs if a.zero_init}, bp.written,
                bs.in_place_refused(plan.variant))
    else:
        results = []
        for alloc in bs.outputs:
            planned = allocations[alloc.name]
            arr, ptr = adapter.empty(planned.shape, alloc.dtype, device, sh)
            results.append(arr)
            vals[alloc.slot] = ptr
            if alloc.zero_init:
                memsets.append((ptr, planned.nbytes))
    drv = _drv_mod or _driver()
    cs = _streams.get(sh)
    if cs is None:
        cs = cu_stream(sh)
    keep: list[Any] = []     # framework scratch arrays: alive until the launches are queued
    ordered: list[tuple] = []  # our scratch, the driver's answers: freed after the launches
    try:
        for alloc in variant.scratch:
            nbytes = allocations[alloc.name].nbytes
            ptr = _temporary(adapter, drv, cs, nbytes, device, sh, keep, ordered,
                             f"{name}: allocating scratch {alloc.name!r}")
            vals[alloc.slot] = ptr
            if alloc.zero_init:
                memsets.append((ptr, nbytes))
        copied = []  # (copy, input, nbytes): inputs read from a copy (.aliasing)
        for ptr, nbytes, input_name in inputs if copies else ():
            if input_name in copies:
                copy = _temporary(adapter, drv, cs, nbytes, device, sh, keep, ordered,
                                  f"{name}: allocating a copy of {input_name!r} (in-place use)")
                copied.append((copy, ptr, nbytes))
                vals[bs.input_slot[input_name]] = copy
        _queue(bp, st, plan, variant, vals, cs, memsets, copied)
    finally:
        for answer in ordered:
            _drv.free_ordered(drv, cs, answer)
    if n_out == 1:
        return results[0]
    return tuple(results) if n_out else None


def _temporary(adapter: Any, drv: Any, cs: Any, nbytes: int, device: int, sh: int,
               keep: list, ordered: list, what: str) -> int:
    """Device memory for the call's duration (scratch, a copy of an input): stream-ordered
    from the driver (freed by the caller, from ``ordered``, after the launches are queued; a
    graph capture records both), or the framework's array (alive in ``keep`` until then)."""
    if adapter.driver_scratch:
        return _drv.allocate_ordered(drv, max(nbytes, 1), cs, ordered, what)
    arr, ptr = adapter.scratch(nbytes, device, sh)
    keep.append(arr)
    return ptr


def _queue(bp: Any, st: Any, plan: Any, variant: Any, vals: list, cs: Any,
           memsets: list, copied: Sequence[tuple[int, int, int]] = ()) -> None:
    """Check that every (repeated) launch's values fit their parameters, then copy the inputs
    read from a copy (``copied``: ``(copy, input, nbytes)``), zero-fill, and launch, in that
    order: a failed check queues nothing."""
    drv = _drv_mod or _driver()
    name = bp.name
    funcs = st.funcs[plan.variant]
    launches = variant.launches
    queued = []
    for pl in plan.launches:
        grid = pl.grid
        if not (grid[0] and grid[1] and grid[2]):
            continue  # an empty grid: nothing to do (size-0 tensors)
        ls = launches[pl.index]
        args = ls.getter(vals) if ls.simple else _arg_values(bp.bound.nbuf, ls, pl, vals)
        try:
            ls.layout.pack(*args)  # range check now, before anything is queued
        except (struct.error, OverflowError) as exc:
            raise LaunchError(f"{name}: an argument of {ls.kernel} does not fit its "
                              f"parameter ({exc})") from None
        if pl.shared_mem > DEFAULT_SHARED_MEM:
            allow_shared(name, st, plan.variant, pl.index, funcs[pl.index], pl.shared_mem,
                         ls.kernel)
        queued.append((ls, funcs[pl.index], pl, args))
    for copy, source, nbytes in copied:
        _drv.check(drv.cuMemcpyDtoDAsync(copy, source, nbytes, cs),
                   f"{name}: copying an input for in-place use")
    for ptr, nbytes in memsets:
        if nbytes:
            _drv.check(drv.cuMemsetD8Async(ptr, 0, nbytes, cs), f"{name}: zero-filling an output")
    launch = launcher().launch
    with bp._lock:  # the parameter blocks are shared by every caller of the program
        for ls, func, pl, args in queued:
            if ls.param_mem is None:
                ls.make_block()
            ls.layout.pack_into(ls.param_mem, 0, *args)
            (gx, gy, gz), (bx, by, bz), smem = pl.grid, pl.block, pl.shared_mem
            err, = launch(func, gx, gy, gz, bx, by, bz, smem, cs, ls.params_addr, 0)
            if err:
                _raise(_drv.error_for(err, f"{name}: launching {ls.kernel} with grid "
                                           f"{(gx, gy, gz)} block {(bx, by, bz)} "
                                           f"shared_mem {smem}"))


#: Dynamic shared memory any kernel may take per block (48 KiB); more needs the function's
#: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES raised first, or the launch fails.
DEFAULT_SHARED_MEM = 48 * 1024


def allow_shared(program: str, st: Any, variant: int, index: int, func: Any, smem: int,
                 kernel: str) -> None:
    """Let launch ``index`` of ``variant`` (function ``func`` on ``st``'s device) take ``smem``
    bytes of dynamic shared memory: above 48 KiB the driver refuses the launch unless the
    function opted in (what CUDA C's ``cudaFuncSetAttribute`` is for). Done once per function
    and size, before anything of the call is queued; beyond the device's limit the
    LaunchError names the kernel, the size and the limit."""
    key = (variant, index)
    if st.smem.get(key, DEFAULT_SHARED_MEM) >= smem:
        return
    drv = _drv_mod or _driver()
    attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    # ``func`` is the library's CUkernel (launchable as it is); the attribute belongs to its
    # CUfunction in the device's context (cuFuncSetAttribute on the CUkernel handle itself:
    # CUDA_ERROR_INVALID_HANDLE on an H200)
    with st.device.pushed():
        err, function = drv.cuKernelGetFunction(int(func))
        if not err:
            err, = drv.cuFuncSetAttribute(function, attr, smem)
    if err:
        optin = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        failed, limit = drv.cuDeviceGetAttribute(optin, st.device.ordinal)
        shown = "less" if failed else f"at most {limit} bytes per block"
        _raise(_drv.error_for(err, f"{program}: {kernel} asks for {smem} bytes of dynamic "
                                   f"shared memory (this device allows {shown}, its static "
                                   f"shared memory included); allowing it"))
    st.smem[key] = smem


def _raise(failure: KernelPackError) -> NoReturn:
    """Raise ``failure`` from its CudaResultError, holding it in no frame's locals (no
    exception -> traceback -> frame cycle: a failed call's outputs are freed at once)."""
    try:
        raise failure from failure.__cause__
    finally:
        del failure


def _arg_values(nbuf: int, ls: Any, pl: Any, vals: list) -> tuple:
    """The slot values of a launch with an argument that reads its loop counter."""
    out = []
    for kind, ref in ls.args:
        if kind == ARG_BUFFER:
            out.append(vals[ref])
        elif kind == ARG_SCALAR:
            out.append(vals[nbuf + ref])
        else:
            out.append(pl.args[ref][1])
    return tuple(out)


def _nbytes(shape: tuple[int, ...], itemsize: int) -> int:
    n = itemsize
    for d in shape:
        n *= d
    return n


_streams: dict[int, Any] = {}


def cu_stream(handle: int) -> Any:
    """What the process's ``cuLaunchKernel`` takes for a raw stream handle, cached (the handle
    itself for the C extension, a ``CUstream`` for cuda.bindings; :mod:`.native`). The driver
    calls of cuda.bindings accept either."""
    s = _streams.get(handle)
    if s is None:
        if len(_streams) > 1024:
            _streams.clear()
        s = _streams[handle] = launcher().stream(handle)
    return s
