"""A program's summary compiled once into flat tables for the launch hot path.

``plan()`` (the loader's planner) builds readable ``Plan`` objects; a launch needs only numbers.
:class:`BoundSummary` encodes every expression of the summary into one validated
:class:`~kernelpack.expr_program.ExprProgram` (closures over data, never generated source), and
lays out for each launch its kernel-parameter block: a ``struct`` format with C alignment (a
pointer is 8 bytes, a scalar its dtype's width, each aligned to its size — the CUDA ABI), so a
call writes all slots with one ``pack_into`` and passes the prebuilt ``kernelParams`` address.

Constants are folded at bind time: an expression spec is an ``int`` (constant) or a
``(root, label)`` tuple evaluated per call.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

from ..dtypes import DType
from ..expr import Expr
from ..expr_program import ExprEncoder
from ..summary import KernelSummary, Scalar, Tensor

__all__ = ["BoundSummary", "InputSpec", "AllocSpec", "LaunchSpec", "VariantSpec", "STRUCT_CODES",
           "scalar_range"]

STRUCT_CODES = {"bool": "?", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H",
                "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q", "float16": "e",
                "bfloat16": "H", "float32": "f", "float64": "d"}

Spec = Any  # int (constant) or (root, label)

# Dim actions for input tensors.
DIM_CONST, DIM_BIND, DIM_SAME, DIM_EXPR = 0, 1, 2, 3
# Kernel argument kinds.
ARG_BUFFER, ARG_SCALAR, ARG_EXPR = 0, 1, 2


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


class _Record:
    """Plain mutable records with ``__slots__`` (not dataclasses: building a dataclass costs a
    few hundred microseconds at import, inside the clock of a process's first launch)."""

    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__
                           if not n.startswith("_"))
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclasses they replace


class InputSpec(_Record):
    """One caller argument: a tensor (``slot`` is its buffer index) or a scalar (``slot`` is
    its index in the scalar list; ``symbol`` its symbol index, -1 if not a symbol). Computed
    values (``BoundSummary.computed``) take the scalar slots after the caller's.
    ``same_symbol``: a scalar whose symbol was already bound by an earlier dim."""

    __slots__ = ("name", "is_tensor", "dtype", "slot", "dims", "symbol", "same_symbol")

    def __init__(self, name: str, is_tensor: bool, dtype: DType, slot: int,
                 dims: list[tuple[int, Any]] | None = None, symbol: int = -1,
                 same_symbol: bool = False) -> None:
        self.name = name
        self.is_tensor = is_tensor
        self.dtype = dtype
        self.slot = slot
        self.dims: list[tuple[int, Any]] = [] if dims is None else dims
        self.symbol = symbol
        self.same_symbol = same_symbol


class AllocSpec(_Record):
    """An output or scratch buffer: buffer index, shape specs, bytes per element.
    ``kind`` is "output" or "scratch"."""

    __slots__ = ("name", "kind", "dtype", "slot", "shape", "zero_init")

    def __init__(self, name: str, kind: str, dtype: DType, slot: int, shape: list[Spec],
                 zero_init: bool) -> None:
        self.name = name
        self.kind = kind
        self.dtype = dtype
        self.slot = slot
        self.shape = shape
        self.zero_init = zero_init


class LaunchSpec(_Record):
    """One (possibly repeated) launch with its parameter block laid out. ``param_buf``: the
    ctypes char array holding the slots; ``params_addr``: the address of the void* array
    pointing at each slot (``_keep`` holds that array); ``simple``: every argument is a buffer
    or a caller scalar; ``getter``: per call, the slot values from the call's value list as a
    tuple; ``dims``: (gx, gy, gz, bx, by, bz, shared_mem) when all are constants."""

    __slots__ = ("module", "kernel", "grid", "block", "shared_mem", "count", "loop_symbol",
                 "args", "layout", "param_buf", "params_addr", "_keep", "simple", "getter",
                 "dims")

    def __init__(self, module: str, kernel: str, grid: list[Spec], block: list[Spec],
                 shared_mem: Spec, count: Spec | None, loop_symbol: int,
                 args: list[tuple[int, Any]], layout: struct.Struct, param_buf: Any,
                 params_addr: int, _keep: Any = None, simple: bool = False, getter: Any = None,
                 dims: Any = None) -> None:
        self.module = module
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.shared_mem = shared_mem
        self.count = count
        self.loop_symbol = loop_symbol
        self.args = args
        self.layout = layout
        self.param_buf = param_buf
        self.params_addr = params_addr
        self._keep = _keep
        self.simple = simple
        self.getter = getter
        self.dims = dims


class VariantSpec(_Record):
    """One variant: its predicate spec (None: always), scratch buffers, launches, and the
    number of buffer slots it uses."""

    __slots__ = ("predicate", "scratch", "launches", "buffer_count")

    def __init__(self, predicate: Spec | None, scratch: list[AllocSpec],
                 launches: list[LaunchSpec], buffer_count: int) -> None:
        self.predicate = predicate
        self.scratch = scratch
        self.launches = launches
        self.buffer_count = buffer_count


class BoundSummary:
    """The summary of one program as tables (see the module docstring)."""

    def __init__(self, summary: KernelSummary) -> None:
        self.summary = summary
        bound = summary.bound_symbols()
        loops = [s for s in summary.loop_symbols() if s not in bound]
        self._encoder = ExprEncoder([*bound, *loops])
        self._labels: list[str] = []
        sym_index = {name: i for i, name in enumerate([*bound, *loops])}
        self.symbol_names = [*bound, *loops]
        self.inputs: list[InputSpec] = []
        self.dim_checks: list[tuple[Spec, str, int, Expr, int]] = []
        seen: set[int] = set()
        tensor_slot = 0
        scalar_slot = 0
        buffer_index: dict[str, int] = {}
        scalar_index: dict[str, int] = {}
        for p in summary.inputs:
            if isinstance(p, Tensor):
                spec = InputSpec(p.name, True, p.dtype, tensor_slot)
                buffer_index[p.name] = tensor_slot
                tensor_slot += 1
                for i, d in enumerate(p.shape):
                    if d.is_const:
                        spec.dims.append((DIM_CONST, int(d.value)))  # type: ignore[arg-type]
                    elif d.is_sym:
                        idx = sym_index[str(d.value)]
                        spec.dims.append((DIM_SAME if idx in seen else DIM_BIND, idx))
                        seen.add(idx)
                    else:
                        spec.dims.append((DIM_EXPR, None))
                        self.dim_checks.append((self._spec(d, f"{p.name}.shape[{i}]"), p.name,
                                                i, d, spec.slot))
                self.inputs.append(spec)
            else:
                assert isinstance(p, Scalar)
                spec = InputSpec(p.name, False, p.dtype, scalar_slot)
                scalar_index[p.name] = scalar_slot
                scalar_slot += 1
                if p.is_symbol:
                    spec.symbol = sym_index[p.name]
                    spec.same_symbol = spec.symbol in seen
                    seen.add(spec.symbol)
                self.inputs.append(spec)
        self.n_tensors = tensor_slot
        self.n_scalars = scalar_slot
        self.computed: list[tuple[int, Spec]] = []  # (scalar slot, spec): per-call values
        self._computed_index: dict[Expr, int] = {}
        self.outputs: list[AllocSpec] = []
        slot = tensor_slot
        for p in summary.outputs:
            self.outputs.append(AllocSpec(p.name, "output", p.dtype, slot,
                                          [self._spec(d, f"{p.name}.shape[{i}]")
                                           for i, d in enumerate(p.shape)], p.zero_init))
            buffer_index[p.name] = slot
            slot += 1
        computed = {p.name: p for p in summary.params if isinstance(p, Scalar) and p.value is not None}
        self.constraints = [(self._spec(c.predicate, "constraint"), c.message or str(c.predicate))
                            for c in summary.constraints]
        self.variants: list[VariantSpec] = []
        for vi, variant in enumerate(summary.variants):
            local = dict(buffer_index)
            scratch = []
            vslot = slot
            for s in variant.scratch:
                scratch.append(AllocSpec(s.name, "scratch", s.dtype, vslot,
                                         [self._spec(d, f"scratch {s.name}.shape[{i}]")
                                          for i, d in enumerate(s.shape)], s.zero_init))
                local[s.name] = vslot
                vslot += 1
            launches = [self._launch(launch, local, scalar_index, computed, sym_index,
                                     f"variant {vi} launch {li}")
                        for li, launch in enumerate(variant.launches)]
            pred = (None if variant.predicate is None
                    else self._spec(variant.predicate, f"variant {vi} predicate"))
            self.variants.append(VariantSpec(pred, scratch, launches, vslot))
        encoded, positions = self._encoder.finish()
        assert self._encoder.program is not None
        self.program = self._encoder.program
        self.nsym = len(encoded.symbols)
        self._resolve(positions)
        self.symbol_template: list[Any] = [None] * self.nsym

    # ---- building -------------------------------------------------------------------------
    def _spec(self, expr: Expr, label: str) -> Spec:
        if expr.is_const:
            return int(expr.value)  # type: ignore[arg-type]
        self._labels.append(label)
        return _Pending(self._encoder.add(expr), label)

    def _computed_arg(self, expr: Expr, loop: str, label: str) -> tuple[int, Any]:
        """A computed argument: evaluated once per call into an extra scalar slot (shared by
        every launch passing the same expression), unless it reads the launch's loop counter,
        in which case it is evaluated per launch."""
        if loop and loop in expr.symbols():
            return (ARG_EXPR, self._spec(expr, label))
        slot = self._computed_index.get(expr)
        if slot is None:
            slot = self._computed_index[expr] = self.n_scalars + len(self.computed)
            self.computed.append((slot, self._spec(expr, label)))
        return (ARG_SCALAR, slot)

    def _launch(self, launch: Any, buffers: dict[str, int], scalars: dict[str, int],
                computed: dict[str, Scalar], sym_index: dict[str, int], where: str) -> LaunchSpec:
        where = f"{where} ({launch.kernel})"
        args: list[tuple[int, Any]] = []
        codes: list[str] = []
        for ai, arg in enumerate(launch.args):
            if arg.kind == "buffer":
                args.append((ARG_BUFFER, buffers[arg.name]))
                codes.append("Q")
            elif arg.kind == "scalar" and arg.name in computed:
                p = computed[arg.name]
                args.append(self._computed_arg(p.value, launch.loop, f"{where} scalar {arg.name}"))
                codes.append(STRUCT_CODES[p.dtype.name])
            elif arg.kind == "scalar":
                param = self.summary.param(arg.name)
                args.append((ARG_SCALAR, scalars[arg.name]))
                codes.append(STRUCT_CODES[param.dtype.name])
            else:
                args.append(self._computed_arg(arg.value, launch.loop, f"{where} argument {ai}"))
                codes.append(STRUCT_CODES[arg.dtype.name])
        layout = struct.Struct("@" + "".join(codes))
        param_buf = ctypes.create_string_buffer(max(layout.size, 1))
        base = ctypes.addressof(param_buf)
        offsets = [struct.calcsize("@" + "".join(codes[:i + 1])) - struct.calcsize(codes[i])
                   for i in range(len(codes))]
        pointers = (ctypes.c_void_p * max(len(codes), 1))(*[base + o for o in offsets])
        spec = LaunchSpec(
            module=launch.module, kernel=launch.kernel,
            grid=[self._spec(g, f"{where} grid[{i}]") for i, g in enumerate(launch.grid)],
            block=[self._spec(b, f"{where} block[{i}]") for i, b in enumerate(launch.block)],
            shared_mem=self._spec(launch.shared_mem, f"{where} shared_mem"),
            count=None if launch.count is None else self._spec(launch.count, f"{where} count"),
            loop_symbol=sym_index[launch.loop] if launch.loop else -1,
            args=args, layout=layout, param_buf=param_buf,
            params_addr=ctypes.addressof(pointers) if codes else 0, _keep=pointers)
        spec.simple = all(kind != ARG_EXPR for kind, _ in args)
        return spec

    def _resolve(self, positions: list[int]) -> None:
        """Replace the pending specs by (root, label) now that roots are numbered."""
        def fix(spec: Spec) -> Spec:
            return (positions[spec.index], spec.label) if isinstance(spec, _Pending) else spec

        self.dim_checks = [(fix(s), n, i, e, k) for s, n, i, e, k in self.dim_checks]
        self.constraints = [(fix(s), m) for s, m in self.constraints]
        self.computed = [(slot, fix(s)) for slot, s in self.computed]
        for alloc in self.outputs:
            alloc.shape = [fix(s) for s in alloc.shape]
        for v in self.variants:
            v.predicate = fix(v.predicate) if v.predicate is not None else None
            for alloc in v.scratch:
                alloc.shape = [fix(s) for s in alloc.shape]
            for ls in v.launches:
                ls.grid = [fix(s) for s in ls.grid]
                ls.block = [fix(s) for s in ls.block]
                ls.shared_mem = fix(ls.shared_mem)
                ls.count = fix(ls.count) if ls.count is not None else None
                ls.args = [(k, fix(r) if k == ARG_EXPR else r) for k, r in ls.args]

    # ---- evaluation helpers (per call) ----------------------------------------------------
    def value(self, frame: list, spec: Spec) -> int:
        if spec.__class__ is int:
            return spec
        return self.program.value(frame, spec[0], spec[1])

    def new_frame(self, symbols: list) -> list:
        return self.program.new_frame(symbols)


class _Pending:
    __slots__ = ("index", "label")

    def __init__(self, index: int, label: str) -> None:
        self.index = index
        self.label = label
