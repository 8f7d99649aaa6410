"""Where each value of a call goes: the runtime's own half of a bound program.

The summary's expressions are not evaluated here. A call asks the program's
:class:`~kernelpack.planner.Planner` — the same compiled evaluation as ``program.plan()``,
with its per-shape cache, and errors worded by the reference planner — for a
:class:`~kernelpack.planner.Plan`; what a launch needs beyond that plan is laid out once per
program by :class:`BoundSummary`:

- a **value list** per call: buffer pointers (inputs, outputs, then the variant's scratch),
  the caller's scalars, then the *fills* — computed scalars and value arguments, copied from
  the plan (the same numbers for every call with that plan);
- per summary launch, its **parameter block**: a ``struct`` format with C alignment (a pointer
  is 8 bytes, a scalar its dtype's width, each aligned to its size — the CUDA ABI), the offset
  of each slot, and which value-list entry goes in each slot, so a call writes every slot with
  one ``pack_into`` and passes a prebuilt ``kernelParams`` address. An argument that reads a
  repeated launch's loop counter differs between the copies of that launch: it is taken from
  each :class:`~kernelpack.planner.PlannedLaunch` itself (:data:`ARG_VALUE`).
"""

from __future__ import annotations

import ctypes
import operator
import struct
from typing import Any, Callable

from .._records import Record
from ..dtypes import DType
from ..summary import KernelSummary, Scalar, Tensor
# at import, not inside a program's first call with inout or out= arguments (about 80 µs of a
# fresh process's time to first result for a module this small)
from .in_place import refused_in_variant

__all__ = ["BoundSummary", "InputSpec", "AllocSpec", "LaunchSpec", "VariantSpec", "STRUCT_CODES",
           "ARG_BUFFER", "ARG_SCALAR", "ARG_VALUE", "scalar_range", "fills_of"]

STRUCT_CODES = {"bool": "?", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H",
                "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q", "float16": "e",
                "bfloat16": "H", "float32": "f", "float64": "d"}

# Kernel argument kinds: a buffer slot, a scalar slot (caller's or fill), or a value the
# planned launch carries (``PlannedLaunch.args[k][1]``).
ARG_BUFFER, ARG_SCALAR, ARG_VALUE = 0, 1, 2


def scalar_range(dtype: DType) -> tuple[int, int] | None:
    """The inclusive value range of an integer dtype (None for floats)."""
    if dtype.kind == "b":
        return 0, 1
    if not dtype.is_integer:
        return None
    bits = dtype.itemsize * 8
    if dtype.kind == "i":
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


class InputSpec(Record):
    """One caller argument: a tensor (``slot`` is its buffer index; ``written``: an
    ``inout`` tensor the kernels write) or a scalar (``slot`` is its index among the caller's
    scalars; ``is_symbol``: an integer the planner reads)."""

    __slots__ = ("name", "is_tensor", "dtype", "slot", "is_symbol", "written")

    def __init__(self, name: str, is_tensor: bool, dtype: DType, slot: int,
                 is_symbol: bool = False, written: bool = False) -> None:
        self.name = name
        self.is_tensor = is_tensor
        self.dtype = dtype
        self.slot = slot
        self.is_symbol = is_symbol
        self.written = written


class AllocSpec(Record):
    """An output or scratch buffer: its buffer index (its shape and size are the plan's
    ``allocations[name]``). ``kind`` is "output" or "scratch"."""

    __slots__ = ("name", "kind", "dtype", "slot", "zero_init")

    def __init__(self, name: str, kind: str, dtype: DType, slot: int, zero_init: bool) -> None:
        self.name = name
        self.kind = kind
        self.dtype = dtype
        self.slot = slot
        self.zero_init = zero_init


class LaunchSpec(Record):
    """One summary launch's parameter block. ``args``: per slot ``(kind, ref)`` (see the
    ``ARG_`` constants); ``order``: for a ``simple`` launch (no :data:`ARG_VALUE`), the
    value-list position of each slot, and ``getter`` reads them as a tuple. ``size`` and
    ``offsets`` lay out the block; the shared block itself is made by :meth:`make_block`
    when the launch first runs on the general path: ``param_mem`` (the bytes the slots are
    packed into), ``param_buf`` (a ctypes view of its first byte, for ``addressof``) and
    ``params_addr``, the address of the ``void*`` array pointing at each slot, which lives in
    the same buffer after the slots."""

    __slots__ = ("module", "kernel", "index", "args", "layout", "size", "offsets", "simple",
                 "order", "getter", "param_buf", "param_mem", "params_addr")

    def __init__(self, module: str, kernel: str, index: int, args: list[tuple[int, int]],
                 codes: list[str]) -> None:
        self.module = module
        self.kernel = kernel
        self.index = index
        self.args = args
        self.layout = struct.Struct("@" + "".join(codes))
        self.size = self.layout.size
        self.offsets = _offsets(codes)
        self.simple = all(kind != ARG_VALUE for kind, _ in args)
        self.order: list[int] = []
        self.getter: Callable[[list], tuple] | None = None
        self.param_buf: Any = None
        self.param_mem: bytearray | None = None
        self.params_addr = 0

    def make_block(self) -> None:
        """Make the shared parameter block (callers hold the program's lock)."""
        # One buffer: the slots at 0, then the ``void*`` array (aligned), written with
        # struct's native "P". The memory is a bytearray, its address taken through a
        # ``c_char`` view: a ctypes array type (``create_string_buffer``'s ``c_char * n``) is
        # created per new size, 20-50 µs of a program's first call. The view keeps the
        # bytearray exported, so it can never be resized (moved) under the driver.
        count = len(self.offsets)
        at = -(-self.size // _POINTER_SIZE) * _POINTER_SIZE
        mem = bytearray(max(at + _POINTER_SIZE * count, 1))
        view = _C_CHAR.from_buffer(mem)
        base = _addressof(view)
        if count:
            struct.pack_into(f"@{count}P", mem, at, *[base + o for o in self.offsets])
        self.params_addr = base + at if count else 0
        self.param_mem = mem
        self.param_buf = view


class VariantSpec(Record):
    """One variant: scratch buffers, launches, the number of buffer slots it uses, and its
    fills: per fill slot ``(name, launch, arg)`` — a computed scalar ``name``
    (``Plan.computed``), or (``name`` empty) value argument ``arg`` of launch ``launch``."""

    __slots__ = ("scratch", "launches", "buffer_count", "fills")

    def __init__(self, scratch: list[AllocSpec], launches: list[LaunchSpec], buffer_count: int,
                 fills: list[tuple[str, int, int]]) -> None:
        self.scratch = scratch
        self.launches = launches
        self.buffer_count = buffer_count
        self.fills = fills


_SIZES: dict[str, int] = {}
_POINTER_SIZE = struct.calcsize("@P")
_C_CHAR = ctypes.c_char
_addressof = ctypes.addressof


def _offsets(codes: list[str]) -> list[int]:
    """Each slot's offset: every code here is aligned to its own size (native ``@``)."""
    out, at = [], 0
    for code in codes:
        size = _SIZES.get(code) or _SIZES.setdefault(code, struct.calcsize(code))
        at = (at + size - 1) // size * size
        out.append(at)
        at += size
    return out


def fills_of(variant: VariantSpec, plan: Any) -> list[int]:
    """The fill values of ``variant`` from ``plan`` (a value argument of a launch that the
    plan repeats zero times is never passed: 0)."""
    out = []
    for name, li, k in variant.fills:
        if name:
            out.append(plan.computed[name])
            continue
        for pl in plan.launches:
            if pl.index == li:
                out.append(pl.args[k][1])
                break
        else:
            out.append(0)
    return out


class BoundSummary:
    """The layout of one program's calls and launches (see the module docstring)."""

    def __init__(self, summary: KernelSummary) -> None:
        self.summary = summary
        self.inputs: list[InputSpec] = []
        buffer_index: dict[str, int] = {}
        scalar_index: dict[str, int] = {}
        tensor_slot = scalar_slot = 0
        for p in summary.inputs:
            if isinstance(p, Tensor):
                self.inputs.append(InputSpec(p.name, True, p.dtype, tensor_slot,
                                             written=p.role == "inout"))
                buffer_index[p.name] = tensor_slot
                tensor_slot += 1
            else:
                assert isinstance(p, Scalar)
                self.inputs.append(InputSpec(p.name, False, p.dtype, scalar_slot, p.is_symbol))
                scalar_index[p.name] = scalar_slot
                scalar_slot += 1
        self.n_tensors = tensor_slot
        #: a tensor input's name -> its value slot (where an input read from a copy goes)
        self.input_slot = dict(buffer_index)
        self.n_scalars = scalar_slot
        self.outputs: list[AllocSpec] = []
        slot = tensor_slot
        for t in summary.outputs:
            self.outputs.append(AllocSpec(t.name, "output", t.dtype, slot, t.zero_init))
            buffer_index[t.name] = slot
            slot += 1
        computed = {p.name: p for p in summary.params
                    if isinstance(p, Scalar) and p.value is not None}
        self.variants: list[VariantSpec] = []
        for variant in summary.variants:
            local = dict(buffer_index)
            scratch = []
            vslot = slot
            for s in variant.scratch:
                scratch.append(AllocSpec(s.name, "scratch", s.dtype, vslot, s.zero_init))
                local[s.name] = vslot
                vslot += 1
            fills: list[tuple[str, int, int]] = []
            launches = [self._launch(li, launch, local, scalar_index, computed, fills)
                        for li, launch in enumerate(variant.launches)]
            self.variants.append(VariantSpec(scratch, launches, vslot, fills))
        self._refused: dict[int, dict[tuple[str, str], str]] = {}
        self.nbuf = max(v.buffer_count for v in self.variants)
        self.fill_from = self.nbuf + self.n_scalars
        self.nvals = self.fill_from + max(len(v.fills) for v in self.variants)
        for v in self.variants:
            for ls in v.launches:
                if ls.simple:
                    ls.order = [r if k == ARG_BUFFER else self.nbuf + r for k, r in ls.args]
                    ls.getter = _getter(ls.order)

    def in_place_refused(self, variant: int) -> dict[tuple[str, str], str]:
        """``{(written, read): why}``: the output or ``inout`` tensor and read-only input of
        ``variant`` (an index) that a call may not pass as the very same memory
        (:mod:`.in_place`). Made on first use, per variant: by a call with ``out=`` or
        ``inout`` arguments, or by the fast paths when they plan a shape."""
        refused = self._refused.get(variant)
        if refused is None:
            refused = self._refused[variant] = refused_in_variant(self.summary, variant)
        return refused

    def _launch(self, li: int, launch: Any, buffers: dict[str, int], scalars: dict[str, int],
                computed: dict[str, Scalar], fills: list[tuple[str, int, int]]) -> LaunchSpec:
        """Lay out one launch; fill slots are numbered per variant in order of first use, so
        that a launch passing buffers, scalars and then computed values in call order reads
        the value list itself (no reordering: see :mod:`.fastpath`)."""
        args: list[tuple[int, int]] = []
        codes: list[str] = []
        for k, arg in enumerate(launch.args):
            if arg.kind == "buffer":
                args.append((ARG_BUFFER, buffers[arg.name]))
                codes.append("Q")
            elif arg.kind == "scalar" and arg.name in computed:
                key = (arg.name, -1, -1)
                if key not in fills:
                    fills.append(key)
                args.append((ARG_SCALAR, self.n_scalars + fills.index(key)))
                codes.append(STRUCT_CODES[computed[arg.name].dtype.name])
            elif arg.kind == "scalar":
                args.append((ARG_SCALAR, scalars[arg.name]))
                codes.append(STRUCT_CODES[self.summary.param(arg.name).dtype.name])
            else:
                if launch.loop and launch.loop in arg.value.symbols():  # type: ignore[union-attr]
                    args.append((ARG_VALUE, k))  # differs between the copies of the launch
                else:
                    fills.append(("", li, k))
                    args.append((ARG_SCALAR, self.n_scalars + len(fills) - 1))
                codes.append(STRUCT_CODES[arg.dtype.name])  # type: ignore[union-attr]
        return LaunchSpec(launch.module, launch.kernel, li, args, codes)


def _getter(order: list[int]) -> Callable[[list], tuple]:
    if len(order) > 1:
        return operator.itemgetter(*order)
    if order:
        i = order[0]
        return lambda vals: (vals[i],)
    return lambda vals: ()
