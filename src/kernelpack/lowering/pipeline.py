"""The compile pipeline as data: an ordered tuple of small stages over one frozen record.

``fusion → graph → schedule → LLVM IR → PTX → images → summary → Compiled``. Each stage is a
function ``Build -> Build`` that fills in one more field; :func:`run` can start from any
stage given a partly filled record (tests inspect the IR or the PTX of a fusion this way).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence, TypeVar

from ..dtypes import DType, int64
from ..errors import CompileError, TraceError
from ..expr import ge, sym
from ..compile_entry import Options, static_dims
from ..fusion import Fusion
from ..graph import Graph
from ..limits import MAX_ARGS, MAX_VARIANTS
from ..compiled import Compiled, Image, Module
from ..summary import Arg, Constraint, KernelSummary, Launch, Scalar, Scratch, Tensor, Variant
from ..targets import Arch, parse_target_list, portable_lowest
from .schedule import Choice, KernelSpec, Stage, lockstep, plan, variants
from .size_checks import computed_size_constraints

__all__ = ["Options", "Build", "STAGES", "run", "compile_fusion", "compile_traced"]

_R = TypeVar("_R")  # what a summary record constructor makes (summarize's ``record``)


@dataclass(frozen=True)
class Build:
    """Everything known about one compilation so far."""

    fusion: Fusion
    archs: tuple[Arch, ...]
    want_ptx: bool
    static: tuple[tuple[str, int], ...] = ()
    options: Options = Options()
    graph: Graph | None = None
    workspaces: tuple[str, ...] | None = None  # materialized reductions (None: not yet looked)
    stages: tuple[Stage, ...] = ()
    general: frozenset[str] = frozenset()  # outputs whose stages take the general schedule
    scratch: tuple[tuple[str, DType], ...] = ()
    ir: str = ""
    kernels: tuple[str, ...] = ()
    # each kernel's buffer parameters as emitted (those its body uses), in order
    kernel_buffers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    libdevice: bool = False
    ptx: bytes = b""
    images: tuple[Image, ...] = ()
    summary: KernelSummary | None = None
    meta: dict = field(default_factory=dict, compare=False)


def trace(b: Build) -> Build:
    return dataclasses.replace(b, graph=b.fusion.trace(dict(b.static)))


def schedule(b: Build) -> Build:
    planned = None
    if b.workspaces is None:  # once: a rescheduled build keeps its rewritten graph
        from .materialize import materialize, materialize_rows

        graph = b.graph
        assert graph is not None
        planned = plan(graph, b.general)
        graph, names = materialize(graph, _general_outputs(graph, planned))
        if names:  # the graph changed: plan it again
            planned = plan(graph, b.general, frozenset(names))
        # row reductions in a stage still general once the others are workspaces (a column
        # mean subtracted before a row sum made that stage a row stage: nothing to do)
        rows, names = materialize_rows(graph, _general_outputs(graph, planned), names)
        if rows is not graph:
            planned = None
        b = dataclasses.replace(b, graph=rows, workspaces=names)
    if planned is None:
        planned = plan(b.graph, b.general,  # type: ignore[arg-type]
                       frozenset(b.workspaces or ()))
    stages = fit_variants(planned)
    scratch: dict[str, DType] = {}
    for st in stages:
        for alt in st.alternatives:
            for s in alt.scratch:
                scratch[s.name] = s.dtype
    return dataclasses.replace(b, stages=stages, scratch=tuple(scratch.items()))


def _general_outputs(graph: Graph, stages: Sequence[Stage]) -> list[list[int]]:
    """The output nodes of each stage on the general schedule."""
    outputs = dict(graph.outputs)
    return [[outputs[name] for name in st.outputs] for st in stages if st.general]


def fit_variants(stages: Sequence[Stage], most: int = MAX_VARIANTS) -> tuple[Stage, ...]:
    """The stages with few enough alternatives that their product (the summary's variants,
    :func:`~.schedule.variants`) stays within the format's ``MAX_VARIANTS``: a fusion with
    several row stages (a softmax and a layernorm of other shapes, three row sums) has one
    variant per combination. While there are too many, the stage with the most alternatives
    loses its last conditional one (its widest rows' kernel): the rows it took go to the next
    alternative whose predicate holds, ultimately the unconditional loop every stage ends
    with. Split alternatives of few, long rows (:mod:`.rowsplit`) go first, widest stage
    first: what the other alternatives run for every other shape stays as it was before the
    split existed (two softmaxes of other shapes kept 8 x 8 = 64 variants; with a split each,
    81, and trimming by width dropped both 8192-wide register kernels). Programs within the
    limit are left as they are."""
    alts = [list(st.alternatives) for st in stages]

    def count() -> int:  # as many as schedule.variants will make
        n = 1
        for a, lead in zip(alts, lockstep(alts)):
            n *= len(a) if lead is None else 1
        return n

    while count() > most:
        # only a conditional split can go: a stage whose static dims make its split the one
        # alternative (predicate None) chosen here found nothing to drop and stopped the
        # trimming of the other stages (a static softmax beside three others: 512 variants)
        split = [k for k in range(len(alts))
                 if any(_splits(c) and c.predicate is not None for c in alts[k])]
        i = max(split or range(len(alts)), key=lambda k: (len(alts[k]), -k))
        conditional = [j for j, c in enumerate(alts[i]) if c.predicate is not None
                       and (_splits(c) or not split)]
        if not conditional:
            break
        # stages in lockstep with this one (the same predicates: column stages over one
        # tensor's columns) lose the same alternative, so that they stay in lockstep: trimming
        # one alone made them independent, multiplied the count and cost more alternatives
        key = [c.predicate for c in alts[i]]
        for k in range(len(alts)):
            if k != i and [c.predicate for c in alts[k]] == key:
                del alts[k][conditional[-1]]
        del alts[i][conditional[-1]]
    return tuple(st if len(a) == len(st.alternatives)
                 else dataclasses.replace(st, alternatives=tuple(a))
                 for st, a in zip(stages, alts))


def _splits(choice: Choice) -> bool:
    """Whether ``choice`` is a row stage's split alternative (partials over rows' chunks)."""
    return any(k.kind == "partial" and k.outer for k in choice.kernels)


def symbols_of(graph: Graph) -> list[str]:
    """The symbols every kernel takes as int64 arguments, in binding order (the summary's):
    the dims bound by the input tensors, then the integer scalars some size reads
    (``kp.arange(1 << q)``). A scalar used only as a value reaches the kernels as its own typed
    argument: passing it as an int64 expression too limited a ``u64`` scalar to int64's range
    (review 28: ``x + s`` refused s = 2**63)."""
    names: list[str] = []
    for _, kind, _, shape in graph.params:
        if kind == "tensor":
            for d in shape:
                if d.is_sym and d.value not in names:
                    names.append(str(d.value))
    scalars = [pname for pname, kind, dt, _ in graph.params
               if kind == "scalar" and dt.kind in "iub" and pname not in names]
    if scalars:
        read = _symbols_read(graph)
        names.extend(pname for pname in scalars if pname in read)
    return names


def _symbols_read(graph: Graph) -> set[str]:
    """Every symbol an expression of the graph reads: node shapes and Expr attributes."""
    read: set[str] = set()
    for _, e in graph.expressions():
        read |= e.symbols()
    return read


def _row_read_elsewhere(b: Build, stage: Stage, node: int) -> Build:
    """``b`` to schedule again after the codegen found reduction ``node``, kept per row by a
    kernel of ``stage``, read at another row: that reduction computed into a workspace of
    its own, which the stage then reads like an input; or, when it already is one, the stage
    on the general schedule (one thread per output element)."""
    from . import materialize

    graph, spaces = b.graph, b.workspaces or ()
    assert graph is not None
    if materialize.ROWS_READ_ELSEWHERE and not any(
            nid == node for name, nid in graph.outputs if name in spaces):
        graph, spaces = materialize.materialize_nodes(graph, [node], spaces)
        return dataclasses.replace(b, graph=graph, workspaces=spaces)
    return dataclasses.replace(b, general=b.general | set(stage.outputs))


def llvm_ir(b: Build) -> Build:
    from llvmlite import ir

    from .codegen import NotRowSchedulable

    graph = b.graph
    assert graph is not None
    _check_arguments(b)
    module = _module(graph.name)
    names: list[str] = []
    buffers: dict[str, tuple[str, ...]] = {}
    uses_libdevice = False
    for i, st in enumerate(b.stages):
        try:
            uses_libdevice |= _emit_stage(module, b, st, names, buffers=buffers)
        except NotRowSchedulable as exc:
            keys = [later.outputs[0] for later in b.stages[i:]]
            return llvm_ir(_settle(b, keys, exc.node, exc.kernel))
    module.add_named_metadata("llvm.module.flags",
                              [ir.Constant(ir.IntType(32), 4),
                               ir.MetaDataString(module, "nvvm-reflect-ftz"),
                               ir.Constant(ir.IntType(32), 0)])
    return dataclasses.replace(b, ir=str(module), kernels=tuple(names),
                               kernel_buffers=tuple(buffers.items()), libdevice=uses_libdevice)


def _check_arguments(b: Build) -> None:
    """Refuse a kernel past the format's ``MAX_ARGS`` launch arguments before the module is
    emitted, optimized and assembled: ``summarize`` would refuse it only after all of that,
    minutes for a fusion that large (260 padded row sums: ~600 kernels). A kernel passes its
    signature's buffers less those its body never uses, so only a kernel whose whole
    signature is past the limit is emitted here, alone into a scratch module, to count the
    buffers it keeps; the message is ``summarize``'s (``Launch``'s own check). A kernel the
    row schedule cannot take yet (NotRowSchedulable) is left to ``llvm_ir``, which settles
    it first; ``summarize`` still checks every launch as made."""
    from .codegen import NotRowSchedulable
    from .kernels import emit

    graph = b.graph
    assert graph is not None
    scratch = dict(b.scratch)
    syms = symbols_of(graph)
    for spec in (spec for st in b.stages for alt in st.alternatives for spec in alt.kernels):
        if len(_launch_arguments(graph, spec, scratch, syms)[1]) <= MAX_ARGS:
            continue
        try:
            kept = emit(_module("args"), graph, spec, scratch, syms).buffers
        except NotRowSchedulable:
            continue
        count = len(_launch_arguments(graph, spec, scratch, syms, kept)[1])
        if count > MAX_ARGS:
            raise TraceError(f"fusion {graph.name}: launch {spec.name!r}: {count} arguments "
                             f"exceed {MAX_ARGS}")


def _launch_arguments(graph: Graph, spec: KernelSpec, scratch: dict[str, DType],
                      syms: Sequence[str], kept: Collection[str] | None = None
                      ) -> tuple[list[str], tuple[Arg, ...]]:
    """The buffers and the arguments of ``spec``'s launch: its signature's buffers (those in
    ``kept``, the kernel's as emitted; None: all of them), its scalars, then the dims. One
    list for the summary's launch and for :func:`_check_arguments`'s count before emission."""
    from .kernels import signature

    bufs, scalars = signature(graph, spec, scratch)
    names = [n for n, _ in bufs if kept is None or n in kept]
    args = [Arg.buffer(n) for n in names] + [Arg.scalar(n) for n, _ in scalars] \
        + [Arg.of(sym(s), int64) for s in syms]
    return names, tuple(args)


def _module(name: str) -> Any:
    """An empty LLVM module for the NVPTX target."""
    from llvmlite import ir

    from ..toolchain.llvm import TRIPLE, data_layout

    module = ir.Module(name=name)
    module.triple = TRIPLE
    module.data_layout = data_layout()
    return module


def _emit_stage(module: Any, b: Build, stage: Stage, names: list[str],
                first: str | None = None, buffers: dict[str, tuple[str, ...]] | None = None
                ) -> bool:
    """Emit the kernels of ``stage`` not in ``names`` into ``module`` (their names appended,
    their buffer parameters put in ``buffers``), the one named ``first`` (when the stage has
    it) before the others; whether one calls libdevice. Raises the codegen's
    NotRowSchedulable, its ``kernel`` set to the kernel that raised it."""
    from .codegen import NotRowSchedulable
    from .kernels import emit

    graph = b.graph
    assert graph is not None
    specs = [spec for alt in stage.alternatives for spec in alt.kernels]
    specs.sort(key=lambda spec: spec.name != first)  # stable: the others keep their order
    uses_libdevice = False
    for spec in specs:
        if spec.name in names:
            continue
        try:
            em = emit(module, graph, spec, dict(b.scratch), symbols_of(graph))
        except NotRowSchedulable as exc:
            exc.kernel = spec.name
            raise
        names.append(spec.name)
        if buffers is not None:
            buffers[spec.name] = tuple(em.buffers)
        uses_libdevice |= em.uses_libdevice
    return uses_libdevice


def _settle(b: Build, keys: list[str], node: int, failed: str | None) -> Build:
    """``b`` scheduled again until the stages named by ``keys`` (an output of each: the stage
    whose kernel ``failed`` found reduction ``node`` read at another row, then the stages
    after it) emit: each reduction their kernels read at another row is materialized in turn
    (:func:`_row_read_elsewhere`). Only these stages are emitted while probing, into a
    scratch module, the kernel that raised first (a split's partial kernels before it never
    read a row's value), so k such reductions in s stages cost about k + s stage emissions
    and one restart of the whole program, not a restart per reduction or per stage (each
    re-emitting every stage made so far: 32 reductions took ~11 s)."""
    from .codegen import NotRowSchedulable

    pending: int | None = node
    for key in keys:
        while True:
            stage = next(st for st in b.stages if key in st.outputs)
            if pending is not None:
                b = schedule(_row_read_elsewhere(b, stage, pending))
                stage = next(st for st in b.stages if key in st.outputs)
            try:
                _emit_stage(_module("probe"), b, stage, [], failed)
            except NotRowSchedulable as exc:
                pending, failed = exc.node, exc.kernel
                continue
            pending = failed = None
            break
    return b


def ptx(b: Build) -> Build:
    from ..toolchain.llvm import emit_ptx

    cpu = portable_lowest(b.archs).sm  # one PTX serves every cubin and the "ptx" image
    text = emit_ptx(b.ir, cpu, b.kernels, b.libdevice, b.options.opt)
    # LLVM numbers call sequences in comments with a per-process counter (`{ // callseq 3,
    # 0`): a second compile in one process gave other PTX bytes (float64 sin/cos call their
    # slow path). The comments go; nvJitLink's cubins are the same with or without them.
    return dataclasses.replace(b, ptx=_CALLSEQ.sub(b"", text))


_CALLSEQ = re.compile(rb"[ \t]*// callseq \d+(?:, \d+)?")


def toolchain_string(libdevice: bool) -> str:
    from .. import __version__
    from ..toolchain import nvjitlink
    from ..toolchain.llvm import llvm_version

    parts = [f"kernelpack {__version__}", llvm_version(), nvjitlink.toolchain_id()]
    if libdevice:
        from ..toolchain.libdevice import digest

        parts.append(f"libdevice {digest()}")
    return "; ".join(parts)


def images(b: Build) -> Build:
    from ..toolchain import nvjitlink

    tool = toolchain_string(b.libdevice)
    cuda = nvjitlink.cuda_version()
    cubins = nvjitlink.ptx_to_cubins(b.ptx, b.archs, name=f"{b.fusion.name}.ptx")
    out = [Image("cubin", arch, cubin, toolchain=tool, cuda_version=cuda)
           for arch, cubin in zip(b.archs, cubins)]
    if b.want_ptx:
        img = nvjitlink.ptx_image(b.ptx, toolchain=tool)
        out.append(dataclasses.replace(img, cuda_version=cuda))
    return dataclasses.replace(b, images=tuple(out))


def summarize(b: Build) -> Build:
    graph = b.graph
    assert graph is not None
    params: list = []
    for pname, kind, dt, shape in graph.params:
        params.append(Tensor(pname, dt, shape) if kind == "tensor" else Scalar(pname, dt))
    for oname, nid in graph.outputs:
        if oname in (b.workspaces or ()):
            continue  # a materialized reduction: the variants' scratch
        node = graph.nodes[nid]
        params.append(Tensor(oname, node.dtype, node.shape, role="out"))
    syms = symbols_of(graph)
    scratch = dict(b.scratch)
    from .elsewhere import reads_elsewhere

    emitted = dict(b.kernel_buffers)  # a build stopped before llvm_ir: every buffer
    made: dict[str, Launch] = {}  # a kernel's launch, made once for every variant holding it

    def record(make: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
        """``make(*args, **kwargs)``: a summary record, which checks the format's limits
        (kernelpack.limits: arguments per launch, launches per variant, ...) as it is made.
        A fusion past one is the user's TraceError naming it, whichever record refuses it;
        a ValueError of the pipeline's own work is not relabelled."""
        try:
            return make(*args, **kwargs)
        except ValueError as exc:
            raise TraceError(f"fusion {graph.name}: {exc}") from None

    def launch_of(spec: KernelSpec) -> Launch:
        kept = None
        if emitted:  # the kernel as emitted: its launch must pass what it declares
            kept = emitted.get(spec.name)
            if kept is None:
                raise CompileError(f"fusion {graph.name}: internal error: kernel "
                                   f"{spec.name} was not emitted")
        bufs, args = _launch_arguments(graph, spec, scratch, syms, kept)
        elsewhere = reads_elsewhere(graph, spec, bufs)
        # a pointwise kernel loads its element(s) of everything before storing any
        # (kernels._vectors, kernels._store_outputs): several outputs may be in place
        return record(Launch, spec.name, graph.name, (spec.grid,), (spec.block,), args,
                      reads_elsewhere=elsewhere, stores_after_loads=spec.kind == "pointwise")

    out_variants = []
    for pred, chosen in variants(list(b.stages)):
        launches: list[Launch] = []
        ws: list[Scratch] = []
        for alt in chosen:
            ws.extend(alt.scratch)
            for spec in alt.kernels:
                if spec.name not in made:
                    made[spec.name] = launch_of(spec)
                launches.append(made[spec.name])
        out_variants.append(record(Variant, tuple(launches), tuple(ws), pred))
    constraints = _pad_constraints(graph)
    evaluated = [d for p in params if isinstance(p, Tensor) for d in p.shape]
    constraints += computed_size_constraints(graph, evaluated
                                             + [c.predicate for c in constraints])
    summary = record(KernelSummary, graph.name, tuple(params), tuple(out_variants), constraints)
    return dataclasses.replace(b, summary=summary)


def _pad_constraints(graph: Graph) -> tuple[Constraint, ...]:
    """``kp.pad`` only adds zeros at the end: a target length below the axis's length would
    silently drop elements (the kernel reads only the first ``size``), so the plan refuses
    it; a length that is short for every shape is a TraceError now."""
    live = graph.reachable(nid for _, nid in graph.outputs)
    out: list[Constraint] = []
    for node in graph.nodes:
        if node.op != "pad" or node.id not in live:
            continue
        (axis,) = node.attrs
        new, old = node.shape[axis], graph.nodes[node.inputs[0]].shape[axis]
        pred = ge(new, old)
        message = f"kp.pad: axis {axis} padded to {new} must be at least its length {old}"
        if pred.is_const and not pred.value:
            raise TraceError(f"fusion {graph.name}: {message}")
        if not pred.is_const and new != old:
            out.append(Constraint(pred, message))
    return tuple(out)


STAGES: tuple[tuple[str, Callable[[Build], Build]], ...] = (
    ("trace", trace), ("schedule", schedule), ("llvm_ir", llvm_ir), ("ptx", ptx),
    ("images", images), ("summary", summarize),
)


def run(b: Build, start: str = "trace", stop: str | None = None) -> Build:
    """Run the stages from ``start`` through ``stop`` (inclusive; None: to the end)."""
    names = [n for n, _ in STAGES]
    if start not in names or (stop is not None and stop not in names):
        raise ValueError(f"stage names are {names} (got start={start!r}, stop={stop!r})")
    for name, fn in STAGES[names.index(start):]:
        b = fn(b)
        if name == stop:
            break
    return b


def new_build(f: Fusion, targets: Sequence[str], static: Mapping[str, int] | None,
              options: Mapping[str, object]) -> Build:
    if not isinstance(f, Fusion):
        raise TypeError(f"kp.compile takes a @kp.fusion function (got {f!r})")
    archs, want_ptx = parse_target_list(targets)
    build = Build(f, tuple(archs), want_ptx, static_dims(f, static), Options.parse(options))
    from ..toolchain.nvjitlink import check_archs

    check_archs(archs)  # before LLVM, which writes to stderr about a processor it does not know
    return build


def compile_fusion(f: Fusion, targets: Sequence[str] = ("sm_80", "sm_90", "ptx"), *,
                   static: Mapping[str, int] | None = None, cache: object = None,
                   **options: object) -> Compiled:
    """Lower a fusion to PTX and cubins; see :func:`kernelpack.compile` (with ``cache``, the
    lookup is :func:`kernelpack.compile_entry.compile`'s, which calls back here on a miss)."""
    if cache is not None:
        from ..compile_entry import compile as compile_cached

        return compile_cached(f, targets, static=static, cache=cache, **options)
    return compile_traced(f, None, targets, static, options)


def compile_traced(f: Fusion, graph: Graph | None, targets: Sequence[str],
                   static: Mapping[str, int] | None, options: Mapping[str, object]) -> Compiled:
    """Lower ``graph``, ``f``'s trace with ``static`` made (None: trace it now). The cache's
    front door traces once for both the key and the code (``compile_entry._traced_key``)."""
    build = new_build(f, targets, static, options)
    if graph is None:
        done = run(build)
    else:
        done = run(dataclasses.replace(build, graph=graph), start="schedule")
    assert done.summary is not None
    module = Module(f.name, done.kernels, done.images)
    return Compiled(summary=done.summary, modules=(module,), origin="compiled")
