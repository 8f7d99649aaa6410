"""The launch path: a program bound once, then per call shapes → numbers → slots → launch.

Binding (first call) lays out the parameter blocks (:mod:`.binding`) and takes the program's
:class:`~kernelpack.planner.Planner` (the loader's, shared with ``program.plan()``); the first
call on a device loads the modules for it (:mod:`.library`) and casts each ``CUkernel`` to the
function handle ``cuLaunchKernel`` takes (:mod:`.native`: an int for the C extension, a
``CUfunction`` for cuda.bindings). A call then reads the arguments (framework fast
paths), asks the planner for the plan of these shapes and scalars (cached per shape; it checks
every constraint and evaluates every expression), allocates outputs in the caller's framework
(or takes ``out=``), writes every slot with one ``struct.pack_into`` and calls
``cuLaunchKernel`` with the prebuilt ``kernelParams`` address.

The summary is evaluated in one place, so a call's errors are ``program.plan(...)``'s.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import weakref
from typing import Any, Callable, Sequence

from ..errors import LaunchError
from . import driver as _drv
from .aliasing import inputs_to_copy_for_written
from .arrays import (GENERIC, Adapter, adapter_for, check_stream_device, readonly_why,
                     release_held, stream_handle)
from .binding import BoundSummary, scalar_range
from .device import Device, check_ordinal, current_device_ordinal, get_device
from .library import load_module, preload
from .native import launcher
from .execute import run
from .scalars import convert_scalar

__all__ = ["BoundProgram", "bind"]

_adapters_by_type: dict[type, Adapter] = {}


class _DeviceState:
    """What a bound program needs on one device: the device and one function per launch
    (``funcs[variant][launch]``, and the same in one list, variant after variant: ``flat``,
    which the fast paths index). ``smem``: per ``(variant, launch)`` the dynamic shared memory
    its function was allowed beyond the default 48 KiB (:func:`~.execute.allow_shared`)."""

    __slots__ = ("device", "funcs", "flat", "libraries", "smem")

    def __init__(self, device: Device, funcs: list[list[Any]], libraries: list[Any]) -> None:
        self.device = device
        self.funcs = funcs
        self.flat = [f for variant in funcs for f in variant]
        self.libraries = libraries
        self.smem: dict[tuple[int, int], int] = {}


class BoundProgram:
    """A program ready to launch; made once per program by :func:`bind`."""

    def __init__(self, program: Any) -> None:
        self.name = program.summary.name
        self.bound = BoundSummary(program.summary)
        self.modules = _modules_of(program)
        self._states: dict[int, _DeviceState] = {}
        self._lock = threading.Lock()
        bs = self.bound
        self._input_names = [s.name for s in bs.inputs]
        self._ranges = [scalar_range(s.dtype) if not s.is_tensor else None for s in bs.inputs]
        self._tokens: dict[Adapter, list[Any]] = {}
        self._nbuf, self._nvals = bs.nbuf, bs.nvals
        #: tensors the program writes (role inout): checked against the others per call
        self.written = frozenset(s.name for s in bs.inputs if s.is_tensor and s.written)
        self.planner = _planner_of(program)
        #: ``plan_shapes(shapes, scalars) -> Plan``: the one evaluation of the summary
        self.plan_shapes = self.planner.plan_shapes
        # What call_program invokes: the general path until the first device is bound, then
        # the torch/cupy fast path when the program fits one (see fastpath.py).
        self.call: Any = self.__call__
        self._fast_for: frozenset[str] = frozenset()
        self._fast_pending = False
        _live.add(self)  # so that a forked child can drop this process's launch state

    def _forget_devices(self) -> None:
        """After ``fork``, in the child: the parent's per-device state (its loaded functions,
        the fast path built on them) is not valid here, and the lock may be held by a parent
        thread that does not exist in the child. The next call binds again from scratch."""
        self._lock = threading.Lock()
        self._states = {}
        self._fast_for = frozenset()
        self._fast_pending = False
        self.call = self.__call__

    # ---- per device ------------------------------------------------------------------------
    def state(self, ordinal: int) -> _DeviceState:
        st = self._states.get(ordinal)
        if st is not None:
            return st
        with self._lock:
            st = self._states.get(ordinal)
            if st is None:
                device = get_device(ordinal)
                libs: dict[str, Any] = {}
                for name, module in self.modules.items():
                    libs[name] = load_module(module, device)[1]
                function = launcher().function
                funcs = [[function(int(libs[ls.module].kernels[ls.kernel]))
                          for ls in v.launches] for v in self.bound.variants]
                st = self._states[ordinal] = _DeviceState(device, funcs, list(libs.values()))
                self._defer_fast_path()
        return st

    def _defer_fast_path(self) -> None:
        """Build the fast path on the *next* call, not now: the first call of a process takes
        the general path anyway, and building (and importing) the fast path inside it is what a
        process's time to first result would pay for nothing. ``_fast_for`` already names the
        frameworks the build will cover, so a first call does not trigger a rebuild."""
        self._fast_for = frozenset(n for n in ("torch", "cupy") if n in sys.modules)
        self._fast_pending = True
        self.call = self._fast_on_next_call

    def _fast_on_next_call(self, args: Sequence[Any], out: Any = None,
                           stream: Any = None) -> Any:
        with self._lock:
            if self._fast_pending:
                self._refresh_fast_path()
        return self.call(args, out, stream)

    def _refresh_fast_path(self) -> None:
        """(Re)build the fast path, covering every framework imported by now."""
        from .fastpath import make_fast_path

        fast, self._fast_for = make_fast_path(self, self.__call__)
        self._fast_pending = False
        self.call = fast or self.__call__

    def warmup(self, ordinal: int) -> None:
        """Load the program onto device ``ordinal`` and build its fast path now: a server
        warms up to pay at start-up what its first requests would (the first call's loading,
        and the fast path that a first call otherwise leaves to the second)."""
        st = self.state(ordinal)
        for lib in st.libraries:
            preload(lib, st.device)
        with self._lock:
            if self._fast_pending:
                self._refresh_fast_path()

    def _tokens_for(self, adapter: Adapter) -> list[Any]:
        toks = self._tokens.get(adapter)
        if toks is None:
            toks = self._tokens[adapter] = [adapter.dtype_token(s.dtype) if s.is_tensor else None
                                            for s in self.bound.inputs]
        return toks

    # ---- the call ----------------------------------------------------------------------------
    def __call__(self, args: Sequence[Any], out: Any = None, stream: Any = None) -> Any:
        """The general path: any array type, any stream, every check with its own message."""
        try:
            return self._call(args, out, stream)
        finally:
            release_held()  # DLPack capsules read for this call: the work is queued

    def _call(self, args: Sequence[Any], out: Any, stream: Any) -> Any:
        inputs = self.bound.inputs
        if len(args) != len(inputs):
            # name what is missing, as a call by keyword does (merge_inputs)
            why = (f"; missing input(s) {self._input_names[len(args):]}"
                   if len(args) < len(inputs) else "")
            raise TypeError(f"{self.name} takes {len(inputs)} inputs {self._input_names} "
                            f"(got {len(args)}){why}")
        vals: list[Any] = [0] * self._nvals
        shapes: list[Any] = []
        scalars: list[Any] = []
        explicit = None if stream is None else stream_handle(stream)
        sh = explicit or 0
        adapter: Adapter | None = None  # the outputs' framework: the last non-generic one
        read_by: Adapter | None = None  # the adapter ``tokens`` are for (the last one used)
        tokens: list[Any] = []
        device = -2
        first = ""  # the argument that decided ``device``
        foreign = False  # an input read through __cuda_array_interface__ / __dlpack__
        for i, spec in enumerate(inputs):
            arg = args[i]
            if spec.is_tensor:
                ad = _adapters_by_type.get(arg.__class__)
                if ad is None:
                    ad = _adapters_by_type[arg.__class__] = adapter_for(arg)
                if ad is not read_by:
                    # the dtype tokens follow the argument's own adapter: a torch tensor after
                    # a generic one was compared with kernelpack dtypes ("has dtype float32,
                    # expected float32")
                    read_by, tokens = ad, self._tokens_for(ad)
                    if adapter is None or ad is not GENERIC:
                        adapter = ad
                    foreign = foreign or ad is GENERIC
                ptr, shape, dt, dev, contiguous = ad.read(arg, spec.name, sh)
                if dev == -1:  # before the dtype: a host array's dtype may be unreadable
                    raise LaunchError(f"{self.name}: argument {spec.name!r} is in host memory; "
                                      f"move it to a CUDA device first")
                if dt is not tokens[i] and dt != tokens[i]:
                    raise LaunchError(f"{self.name}: argument {spec.name!r} has dtype "
                                      f"{ad.dtype_name(dt)}, expected {spec.dtype}")
                shapes.append(shape)
                if dev != device:
                    if device == -2:
                        device, first = dev, spec.name
                    elif dev != -2:
                        # both names: on a server of 8 GPUs "earlier arguments" is a search
                        raise LaunchError(f"{self.name}: argument {spec.name!r} is on device "
                                          f"{dev}, earlier arguments on device {device} "
                                          f"(argument {first!r}); move them to one device")
                if not contiguous:
                    raise LaunchError(f"{self.name}: argument {spec.name!r} is not "
                                      f"C-contiguous (pass .contiguous() / a packed copy)")
                readonly = readonly_why(arg) if spec.written and ad is GENERIC else None
                if readonly is not None:
                    raise LaunchError(f"{self.name}: argument {spec.name!r} is read-only "
                                      f"({readonly}), but the program writes it (role 'inout')")
                vals[spec.slot] = ptr
            else:
                value = convert_scalar(arg, spec.dtype, self._ranges[i], spec.name, self.name)
                vals[self._nbuf + spec.slot] = value
                scalars.append(value)
        # ranks, dims, constraints, variant, sizes, launch limits: the planner's checks
        plan = self.plan_shapes(shapes, scalars)
        if device < 0:  # no tensor argument says (only scalars, or size-0 arrays)
            # read with the call's stream and the output's name: run() reads it again the
            # same way and so reuses the view (one DLPack export per call; arrays.held_views)
            device = (_out_device(out, self.bound.outputs, sh) if out is not None
                      else current_device_ordinal())
        if explicit is not None:
            check_stream_device(self.name, stream, device)
        if adapter is None:
            adapter = _out_adapter(out) or GENERIC
        if explicit is None:
            sh = adapter.current_stream(device)
            if foreign and sh > 2 and device >= 0:
                # The generic inputs were read before the framework's current stream was
                # known, so their producers were ordered before the legacy default stream
                # (stream 0: DLPack's stream=1, the interface's "stream"). A torch/cupy stream
                # is usually non-blocking and does not wait for that one by itself.
                from .buffer import _order_after

                _order_after(device, 0, sh)
        st = self._states.get(device)
        if st is None:  # a first call on this device: say which argument named a missing one
            if first:
                check_ordinal(device, f"{self.name}: argument {first!r}")
            st = self.state(device)
        spans = _input_spans(inputs, vals, shapes) if out is not None or self.written else ()
        copies = inputs_to_copy_for_written(self.name, spans, self.written,
                                            self.bound.in_place_refused(plan.variant)
                                            ) if self.written else ()
        result = run(self, st, device, sh, adapter, vals, plan, out, spans, copies)
        if adapter.name not in self._fast_for and adapter.name in ("torch", "cupy"):
            with self._lock:  # a framework imported after binding: cover it too
                self._refresh_fast_path()
        return result


def _input_spans(inputs: Sequence[Any], vals: list,
                 shapes: list) -> list[tuple[int, int, str]]:
    """The tensor inputs' ``(pointer, nbytes, name)`` (``shapes`` in their order), which
    ``out=`` must not partially overlap (:func:`~.execute.run`)."""
    spans = []
    tensors = (spec for spec in inputs if spec.is_tensor)
    for spec, shape in zip(tensors, shapes):
        spans.append((vals[spec.slot], spec.dtype.itemsize * math.prod(shape), spec.name))
    return spans


def _planner_of(program: Any) -> Any:
    """The program's own planner (a loaded ``Program`` has one, shared with its ``plan()``),
    else a new one (``kp.Compiled``)."""
    planner = getattr(program, "planner", None)
    if planner is None:
        from ..planner import Planner

        planner = Planner(program.summary)
    return planner


def _modules_of(program: Any) -> dict[str, Any]:
    """name -> module (the loader's ``ModuleInfo`` or a :class:`kernelpack.Module`)."""
    modules = getattr(program, "modules", None)
    if isinstance(modules, dict):
        return modules
    if isinstance(modules, (tuple, list)):
        return {m.name: m for m in modules}
    raise TypeError(f"cannot find the modules of {program!r}: pass a loaded Program or a "
                    f"kp.Compiled")


def _first_out(out: Any, outputs: Sequence[Any]) -> tuple[Any, Any]:
    """The first array of ``out=`` and the output it is for (its name in ``{name: array}``,
    else the first output's); ``(None, None)`` when it holds none: ``()``/``{}``, whose count
    :func:`~.execute.run` then checks against the outputs with its own message."""
    if isinstance(out, dict):
        return next(iter(out.items()), (None, None))[::-1]
    if isinstance(out, (tuple, list)):
        out = out[0] if out else None
    return out, (outputs[0].name if outputs else None)


def _out_device(out: Any, outputs: Sequence[Any], stream: int) -> int:
    """The device of ``out=`` when no input says (only scalars, or NULL-pointer size-0
    arrays); the current device when ``out=`` holds no array or its device is unknown.

    The array is read as :func:`~.execute.run` reads it next, with the call's ``stream`` and
    under its output's name: a DLPack producer is then exported once for the call (run finds
    the held view), and a message names the output as run's would."""
    first, name = _first_out(out, outputs)
    if first is None:
        return current_device_ordinal()
    dev = adapter_for(first).read(first, str(name), stream)[3]
    return dev if dev >= 0 else current_device_ordinal()


def _out_adapter(out: Any) -> Adapter | None:
    first = None if out is None else _first_out(out, ())[0]
    return None if first is None else adapter_for(first)


# Bound programs of objects that cannot hold attributes (frozen ``kp.Compiled``), by
# identity: ``id -> (reference to the program, its BoundProgram)``. The reference is weak where
# the object allows, so a Compiled that is dropped takes its entry with it (a process that
# compiles and calls many kernels would otherwise keep every one); a BoundProgram holds no
# reference to its program, or the entry would keep the program alive.
_bound: dict[int, tuple[Callable[[], Any], BoundProgram]] = {}
_bind_lock = threading.Lock()
# Every BoundProgram alive, weakly: what _after_fork_in_child resets.
_live: "weakref.WeakSet[BoundProgram]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """The forked child keeps the parent's objects, not its GPU state: each bound program
    forgets its devices (a later call loads again, or says why CUDA cannot be used here)."""
    global _bind_lock
    _bind_lock = threading.Lock()
    for bp in list(_live):
        bp._forget_devices()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def bind(program: Any) -> BoundProgram:
    """The :class:`BoundProgram` of ``program`` (built once; cached on the program object, or
    by identity for objects that cannot hold attributes such as frozen ``kp.Compiled``)."""
    bp = getattr(program, "_kp_bound", None)
    if bp is not None:
        return bp
    with _bind_lock:
        bp = getattr(program, "_kp_bound", None)  # bound by a thread that held the lock first
        if bp is not None:
            return bp
        hit = _bound.get(id(program))
        if hit is not None and hit[0]() is program:
            return hit[1]
        bp = BoundProgram(program)
        try:
            program._kp_bound = bp
        except (AttributeError, TypeError):
            _bound[id(program)] = (_reference(program), bp)
    return bp


def _reference(program: Any) -> Callable[[], Any]:
    """A weak reference to ``program`` that removes its ``_bound`` entry when the program
    goes; a strong one (the entry then lives as long as the process) where weak references
    are not supported."""
    key = id(program)

    def forget(ref: weakref.ref) -> None:
        # runs from the collector, maybe while this thread holds _bind_lock: no lock here;
        # only the entry made with this reference is removed (the id may be reused already)
        hit = _bound.get(key)
        if hit is not None and hit[0] is ref:
            del _bound[key]

    try:
        return weakref.ref(program, forget)
    except TypeError:
        return lambda: program
