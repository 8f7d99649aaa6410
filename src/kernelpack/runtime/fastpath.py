"""Fast paths for PyTorch and CuPy callers: per-call work reduced to what must happen.

Most calls are "tensors of one framework in, one variant, plain launches". For those, a closure
built at bind time reads each tensor's pointer, dtype, device, contiguity and shape through the
framework's own attributes, looks the shapes up in a per-program plan cache (binding, checks
and every expression are evaluated once per distinct shape), allocates the outputs (or checks
``out=``), writes the slots and launches.

Anything unusual (another array type, ``stream=`` without ``out=``, a failed check, a first call on a new
device, a scalar needing conversion) falls back to the general path *before* any launch, so
the general path both handles it and produces the error message: the fast paths never have
to explain a failure, which keeps them short.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from .arrays import stream_handle
from .binding import DIM_BIND, DIM_CONST, DIM_SAME

__all__ = ["make_fast_path"]

Call = Callable[[Any, Any, Any], Any]


def _fits(bs: Any) -> bool:
    if len(bs.variants) != 1 or bs.variants[0].predicate is not None:
        return False
    variant = bs.variants[0]
    if variant.scratch or bs.dim_checks or any(o.zero_init for o in bs.outputs):
        return False
    if any(ls.count is not None or not ls.simple for ls in variant.launches):
        return False
    if not any(s.is_tensor for s in bs.inputs):
        return False
    # f16/bf16/bool scalars need conversion: the general path does it
    return all(s.is_tensor or s.dtype.name in ("float32", "float64") or s.dtype.is_integer
               for s in bs.inputs)


class _Core:
    """The framework-independent half: the plan cache and the launch of a planned call."""

    def __init__(self, bp: Any, out_tokens: list[Any], in_tokens: dict[int, Any]) -> None:
        from . import driver as _drv
        from .execute import _streams, cu_stream

        bs = bp.bound
        self.bp = bp
        prog = bs.program
        self.new_frame, self.value = prog.new_frame, prog.value
        self.nsym, self.nbuf = bs.nsym, bp._nbuf
        self.tensor_dims = [(i, s.dims) for i, s in enumerate(bs.inputs) if s.is_tensor]
        self.in_tokens = in_tokens
        self.symbol_scalars = [(s.symbol, s.same_symbol) for s in bs.inputs
                               if not s.is_tensor and s.symbol >= 0]
        self.computed = [(self.nbuf + slot, spec) for slot, spec in bs.computed]
        self.constraints = [spec for spec, _ in bs.constraints]
        self.outputs = [(o.slot, o.shape, tok) for o, tok in zip(bs.outputs, out_tokens)]
        self.launches = []
        for ls in bs.variants[0].launches:
            specs = [*ls.grid, *ls.block, ls.shared_mem]
            base = [s if s.__class__ is int else 0 for s in specs]
            dynamic = [(j, s[0], s[1]) for j, s in enumerate(specs) if s.__class__ is not int]
            self.launches.append((ls.getter, ls.layout.pack_into, ls.param_buf, ls.params_addr,
                                  base, dynamic))
        self.cache: dict[tuple, Any] = {}
        drv = _drv.bindings()
        self.ctx_get, self.launch = drv.cuCtxGetCurrent, drv.cuLaunchKernel
        self.error_for = _drv.error_for
        self.streams, self.cu_stream = _streams, cu_stream

    def plan(self, key: tuple) -> Any:
        """Bind, check and evaluate for one key (input shapes, then integer scalars); None
        when anything fails (the general path then explains). Cached per key."""
        value = self.value
        syms: list[Any] = [None] * self.nsym
        for (_, dims), shape in zip(self.tensor_dims, key):
            if len(shape) != len(dims):
                return None
            for (kind, a), n in zip(dims, shape):
                if kind == DIM_BIND:
                    syms[a] = n
                elif kind == DIM_SAME:
                    if syms[a] != n:
                        return None
                elif kind == DIM_CONST and n != a:
                    return None
        for (sym, same), v in zip(self.symbol_scalars, key[len(self.tensor_dims):]):
            if same and syms[sym] != v:
                return None
            syms[sym] = v
        frame = self.new_frame(syms)
        try:
            for spec in self.constraints:
                if not (spec if spec.__class__ is int else value(frame, spec[0], spec[1])):
                    return None
            fills = [(pos, spec if spec.__class__ is int else value(frame, spec[0], spec[1]))
                     for pos, spec in self.computed]
            shapes = []
            for _, dims, _ in self.outputs:
                shape = tuple(s if s.__class__ is int else value(frame, s[0], s[1]) for s in dims)
                if any(n < 0 for n in shape):
                    return None
                shapes.append(shape)
            todo = []
            for j, (getter, pack, buf, addr, base, dynamic) in enumerate(self.launches):
                dims = base.copy()
                for jj, root, what in dynamic:
                    dims[jj] = value(frame, root, what)
                if any(not 0 <= v < (1 << 32) for v in dims):
                    return None
                if dims[0] and dims[1] and dims[2]:
                    todo.append((getter, pack, buf, addr, j, *dims))
        except ArithmeticError:  # ExpressionError / ExprEvalError
            return None
        # An output shaped and typed like an input can be allocated "like" it, which is
        # cheaper than parsing dtype/device arguments; inputs here are contiguous.
        likes = []
        for (_, _, tok), shape in zip(self.outputs, shapes):
            likes.append(next((i for (i, _), ishape in zip(self.tensor_dims, key)
                               if self.in_tokens[i] is tok and tuple(ishape) == shape), -1))
        if len(self.cache) >= 256:
            self.cache.clear()
        entry = self.cache[key] = (fills, shapes, todo, likes)
        return entry

    def make_fire(self) -> Callable[[Any, int, list, list], bool]:
        """``fire(state, stream, todo, vals)``: write the slots and launch; False (nothing
        launched) when a value does not fit its parameter, so that the caller falls back to
        the general path. A closure: the hot path reads cells, not attributes."""
        ctx_get, launch, error_for = self.ctx_get, self.launch, self.error_for
        streams, cu_stream, lock, name = self.streams, self.cu_stream, self.bp._lock, self.bp.name

        def fire(st: Any, sh: int, todo: list, vals: list) -> bool:
            if sh < 3:  # NULL / legacy / per-thread default stream: the current context decides
                err, cur = ctx_get()
                if err or int(cur) != st.device.ctx_id:
                    st.device.make_current()
            cs = streams.get(sh)
            if cs is None:
                cs = cu_stream(sh)
            funcs = st.funcs[0]
            with lock:  # the parameter blocks are shared by every caller of the program
                try:
                    for item in todo:
                        item[1](item[2], 0, *item[0](vals))
                except Exception:  # struct.error / OverflowError
                    return False
                for _, _, _, addr, j, gx, gy, gz, bx, by, bz, smem in todo:
                    err, = launch(funcs[j], gx, gy, gz, bx, by, bz, smem, cs, addr, 0)
                    if err:
                        exc = error_for(err, f"{name}: launching kernel with grid "
                                             f"{(gx, gy, gz)} block {(bx, by, bz)}")
                        raise exc from exc.__cause__
            return True

        return fire


def _scalar_table(bp: Any) -> list[tuple]:
    bs = bp.bound
    return [(i, bp._nbuf + s.slot, s.symbol >= 0, bp._ranges[i])
            for i, s in enumerate(bs.inputs) if not s.is_tensor]


def _torch_path(bp: Any, slow: Call, torch: Any) -> Call | None:
    bs = bp.bound
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    tok = {s.name: getattr(torch, s.dtype.name, None) for s in (*bs.inputs, *bs.outputs)
           if getattr(s, "is_tensor", True)}
    if raw_stream is None or None in tok.values():
        return None
    core = _Core(bp, [tok[o.name] for o in bs.outputs],
                 {i: tok[s.name] for i, s in enumerate(bs.inputs) if s.is_tensor})
    Tensor, empty, empty_like, make_device = torch.Tensor, torch.empty, torch.empty_like, \
        torch.device
    tensors = [(i, s.slot, tok[s.name]) for i, s in enumerate(bs.inputs) if s.is_tensor]
    scalars = _scalar_table(bp)
    outputs = core.outputs
    single_out = len(outputs) == 1
    n_in, nvals, states = len(bs.inputs), bp._nvals, bp._states
    cache, plan, fire = core.cache, core.plan, core.make_fire()
    devices: dict[int, Any] = {}

    def call(args: Any, out: Any, stream: Any) -> Any:
        if len(args) != n_in or (stream is not None and out is None):
            return slow(args, out, stream)  # outputs for another stream: general path
        vals = [0] * nvals
        key = []
        device = -2
        for i, slot, dt in tensors:
            t = args[i]
            if t.__class__ is not Tensor or t.dtype is not dt or not t.is_contiguous():
                return slow(args, out, stream)
            d = t.get_device()
            if d != device:
                if device != -2 or d < 0:
                    return slow(args, out, stream)
                device = d
            key.append(t.shape)
            vals[slot] = t.data_ptr()
        for i, pos, is_symbol, rng in scalars:
            v = args[i]
            if rng is None:
                if v.__class__ is not float:
                    return slow(args, out, stream)
            elif v.__class__ is not int or not rng[0] <= v <= rng[1]:
                return slow(args, out, stream)
            elif is_symbol:
                key.append(v)
            vals[pos] = v
        st = states.get(device)
        k = tuple(key)
        entry = cache.get(k) or plan(k)
        if entry is None or st is None:  # or a first call on this device: bind it there
            return slow(args, out, stream)
        fills, shapes, todo, likes = entry
        for pos, v in fills:
            vals[pos] = v
        if out is None:
            result = []
            for (slot, _, dt), shape, like in zip(outputs, shapes, likes):
                if like >= 0:
                    t = empty_like(args[like])
                else:
                    dev = devices.get(device)
                    if dev is None:
                        dev = devices[device] = make_device("cuda", device)
                    t = empty(shape, dtype=dt, device=dev)
                vals[slot] = t.data_ptr()
                result.append(t)
        elif single_out and out.__class__ is Tensor:
            slot, _, dt = outputs[0]
            if (out.dtype is not dt or out.get_device() != device or not out.is_contiguous()
                    or out.shape != shapes[0]):
                return slow(args, out, stream)
            vals[slot] = out.data_ptr()
            result = [out]
        else:
            return slow(args, out, stream)
        sh = raw_stream(device) if stream is None else stream_handle(stream)
        if not fire(st, sh, todo, vals):
            return slow(args, out, stream)
        if single_out:
            return result[0]
        return tuple(result) if result else None

    return call


def _cupy_path(bp: Any, slow: Call, cupy: Any) -> Call | None:
    import numpy

    bs = bp.bound
    try:
        tok = {s.name: numpy.dtype(s.dtype.name) for s in (*bs.inputs, *bs.outputs)
               if getattr(s, "is_tensor", True)}
    except TypeError:  # bfloat16: no NumPy dtype
        return None
    core = _Core(bp, [tok[o.name] for o in bs.outputs],
                 {i: tok[s.name] for i, s in enumerate(bs.inputs) if s.is_tensor})
    ndarray, empty, empty_like = cupy.ndarray, cupy.empty, cupy.empty_like
    current_stream, get_device = cupy.cuda.get_current_stream, cupy.cuda.runtime.getDevice
    tensors = [(i, s.slot, tok[s.name]) for i, s in enumerate(bs.inputs) if s.is_tensor]
    scalars = _scalar_table(bp)
    outputs = core.outputs
    single_out = len(outputs) == 1
    n_in, nvals, states = len(bs.inputs), bp._nvals, bp._states
    cache, plan, fire = core.cache, core.plan, core.make_fire()

    def call(args: Any, out: Any, stream: Any) -> Any:
        if len(args) != n_in or (stream is not None and out is None):
            return slow(args, out, stream)  # outputs for another stream: general path
        vals = [0] * nvals
        key = []
        device = -2
        for i, slot, dt in tensors:
            a = args[i]
            if a.__class__ is not ndarray or a.dtype != dt or not a.flags.c_contiguous:
                return slow(args, out, stream)
            mem = a.data
            d = mem.device_id
            if d != device:
                if device != -2:
                    return slow(args, out, stream)
                device = d
            key.append(a.shape)
            vals[slot] = mem.ptr
        for i, pos, is_symbol, rng in scalars:
            v = args[i]
            if rng is None:
                if v.__class__ is not float:
                    return slow(args, out, stream)
            elif v.__class__ is not int or not rng[0] <= v <= rng[1]:
                return slow(args, out, stream)
            elif is_symbol:
                key.append(v)
            vals[pos] = v
        st = states.get(device)
        k = tuple(key)
        entry = cache.get(k) or plan(k)
        if entry is None or st is None or get_device() != device:
            return slow(args, out, stream)  # the general path switches devices itself
        fills, shapes, todo, likes = entry
        for pos, v in fills:
            vals[pos] = v
        if out is None:
            result = []
            for (slot, _, dt), shape, like in zip(outputs, shapes, likes):
                a = empty_like(args[like]) if like >= 0 else empty(shape, dtype=dt)
                vals[slot] = a.data.ptr
                result.append(a)
        elif single_out and out.__class__ is ndarray:
            slot, _, dt = outputs[0]
            mem = out.data
            if (out.dtype != dt or mem.device_id != device or not out.flags.c_contiguous
                    or out.shape != shapes[0]):
                return slow(args, out, stream)
            vals[slot] = mem.ptr
            result = [out]
        else:
            return slow(args, out, stream)
        sh = current_stream().ptr if stream is None else stream_handle(stream)
        if not fire(st, sh, todo, vals):
            return slow(args, out, stream)
        if single_out:
            return result[0]
        return tuple(result) if result else None

    return call


def make_fast_path(bp: Any, slow: Call) -> tuple[Call | None, frozenset[str]]:
    """A ``call(args, out, stream)`` that dispatches on the first tensor argument's type to
    the torch or cupy fast path (whichever frameworks are imported), else to ``slow``, and the
    names of the frameworks tried (so a framework imported later triggers a rebuild); (None,
    every name) when the program does not fit a fast path at all."""
    if not _fits(bp.bound):
        return None, frozenset(("torch", "cupy"))  # never: do not try again
    paths: dict[type, Call] = {}
    names: set[str] = set()
    torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
    if torch is not None:
        names.add("torch")
        path = _torch_path(bp, slow, torch)
        if path is not None:
            paths[torch.Tensor] = path
    if cupy is not None:
        names.add("cupy")
        path = _cupy_path(bp, slow, cupy)
        if path is not None:
            paths[cupy.ndarray] = path
    if not paths:
        return None, frozenset(names)
    if len(paths) == 1:  # each path checks every argument's type itself
        return next(iter(paths.values())), frozenset(names)
    get = paths.get
    first = next(i for i, s in enumerate(bp.bound.inputs) if s.is_tensor)

    def dispatch(args: Any, out: Any, stream: Any) -> Any:
        path = get(args[first].__class__) if len(args) > first else None
        return (path or slow)(args, out, stream)

    return dispatch, frozenset(names)
