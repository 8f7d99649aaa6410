"""Summary dataclasses → FlatBuffer tables: the ``Program`` of a
:class:`~kernelpack.summary.KernelSummary` and the ``ImageMeta`` of an
:class:`~kernelpack.summary.Image` (the inverse of :mod:`kernelpack._decode`), and the vector
helpers every table of the format is built with.

Pure building, in a fixed order, so the bytes are a function of the summary alone; choosing
what goes in a file (unique programs, shared modules, deduplicated compressed blobs) and
wrapping, signing and writing it is :mod:`kernelpack.serializer`'s job.
"""

from __future__ import annotations

import hashlib
from itertools import islice
from typing import Iterable

import flatbuffers

from ._generated import (Arg as FArg, Constraint as FConstraint, Dim3 as FDim3,
                         ImageMeta as FImage, Launch as FLaunch, Param as FParam,
                         Program as FProgram, Scratch as FScratch, Variant as FVariant,
                         Version as FVersion)
from ._decode import check_expression_work
from .errors import FormatError
from .expr import iter_nodes
from .expr_program import ExprEncoder
from .limits import MAX_EXPR_WORK
from .compiled import IMAGE_KINDS, Image
from .summary import ROLES, KernelSummary, Tensor

__all__ = ["program_table", "image_table", "byte_vector", "u32_vector", "i64_vector",
           "offset_vector", "string_vector", "text", "ARG_KINDS", "ARCH_SUFFIXES"]

# Stored enum values are indices into these (schema enums ArgKind and ArchSuffix).
ARG_KINDS = ("buffer", "scalar", "value")
ARCH_SUFFIXES = ("", "a", "f")


def byte_vector(b: flatbuffers.Builder, data: bytes, align: int = 1) -> int:
    """A ``[ubyte]`` vector copied in one slice, its data ``align``-aligned (the nested body
    needs 8, which ``Builder.CreateByteVector`` cannot ask for)."""
    b.StartVector(1, len(data), align)
    b.head = b.head - len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    return b.EndVector()


def u32_vector(b: flatbuffers.Builder, values: list[int]) -> int:
    b.StartVector(4, len(values), 4)
    for v in reversed(values):
        b.PrependUint32(v)
    return b.EndVector()


def i64_vector(b: flatbuffers.Builder, values: tuple[int, ...]) -> int:
    b.StartVector(8, len(values), 8)
    for v in reversed(values):
        b.PrependInt64(v)
    return b.EndVector()


def offset_vector(b: flatbuffers.Builder, offsets: list[int]) -> int:
    """A vector of tables or strings, in the given order."""
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def text(b: flatbuffers.Builder, value: str, what: str) -> int:
    """A string of the file: ``value`` as UTF-8, or ValueError naming ``what`` holds text
    that is not (a lone surrogate, as ``os.fsdecode`` makes of a file name's stray byte)
    instead of a bare UnicodeEncodeError that names no field."""
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} {value!r} is not valid UTF-8 text: {exc.reason} at "
                         f"character {exc.start}") from None
    return b.CreateString(data)


def string_vector(b: flatbuffers.Builder, names: Iterable[str], what: str) -> int:
    """A vector of strings; ``what`` names them in an error (:func:`text`)."""
    return offset_vector(b, [text(b, n, what) for n in names])


class _Roots:
    """Registers a program's expressions with one ExprEncoder, in a fixed order, each with
    the field it fills (a tuple of parts, joined only for an error message)."""

    def __init__(self, summary: KernelSummary) -> None:
        loops = [s for s in summary.loop_symbols() if s not in summary.bound_symbols()]
        self.name = summary.name
        self.symbols = [*summary.bound_symbols(), *loops]
        self.enc = ExprEncoder(self.symbols)
        self.positions: list[int] = []
        self.exprs: list[object] = []
        self.fields: list[tuple] = []

    def add(self, expr: object, *field: object) -> int:
        self.exprs.append(expr)
        self.fields.append(field)
        return self.enc.add(expr)  # type: ignore[arg-type]

    def finish(self) -> None:
        """Encode; ValueError when readers would refuse the result (writers refuse what
        readers refuse): the expression program's limits, or MAX_EXPR_WORK. The message
        names the program and, where one expression alone is past a limit, its field."""
        try:
            self.encoded, self.positions = self.enc.finish()
        except (FormatError, ValueError) as exc:
            raise self._refused(exc, self._culprit()) from None
        try:
            check_expression_work(len(self.exprs), len(self.encoded.ops),
                                  lambda: self.exprs)  # type: ignore[arg-type,return-value]
        except FormatError as exc:  # the fields together, never one alone: no culprit
            raise self._refused(exc, "") from None

    def _refused(self, exc: Exception, culprit: str) -> ValueError:
        reason = str(exc).removeprefix("expressions exceed the format's limits: ")
        return ValueError(f"program {self.name!r}: {culprit}expressions exceed the format's "
                          f"limits: {reason}")

    def _culprit(self) -> str:
        """``"FIELD: "`` for the first expression that is past a limit on its own, else ""
        (the program's expressions are past it only together). Each field is encoded alone,
        so fields sharing one large expression would cost fields x its size: the search
        gives up after MAX_EXPR_WORK nodes (review 35: 64 launches reading a 65k-node
        expression took 39 s to refuse)."""
        budget = MAX_EXPR_WORK
        for expr, field in zip(self.exprs, self.fields):
            nodes = iter_nodes((expr,))  # type: ignore[arg-type]
            budget -= sum(1 for _ in islice(nodes, budget + 1))
            if budget < 0:
                return ""
            alone = ExprEncoder(self.symbols)
            alone.add(expr)  # type: ignore[arg-type]
            try:
                alone.finish()
            except (FormatError, ValueError):
                return f"{' '.join(map(str, field))}: "
        return ""

    def __getitem__(self, handle: int) -> int:
        return self.positions[handle]


def program_table(b: flatbuffers.Builder, s: KernelSummary) -> int:
    """The ``Program`` table of ``s``: every expression is registered first, in a fixed
    order, so that the shared expression program and its root indices are deterministic."""
    r = _Roots(s)
    param_roots = [([r.add(d, "tensor", p.name, f"shape[{k}]") for k, d in enumerate(p.shape)],
                    -1) if isinstance(p, Tensor)
                   else ([], r.add(p.value, "scalar", p.name, "value")
                         if p.value is not None else -1) for p in s.params]
    constraint_roots = [r.add(c.predicate, f"constraint {k}")
                        for k, c in enumerate(s.constraints)]
    variant_roots = []
    for i, v in enumerate(s.variants):
        pred = r.add(v.predicate, f"variant {i}", "predicate") if v.predicate is not None else -1
        scratch = [[r.add(d, f"variant {i}", "scratch", sc.name, f"shape[{k}]")
                    for k, d in enumerate(sc.shape)] for sc in v.scratch]
        launches = []
        for j, ln in enumerate(v.launches):
            at = (f"variant {i}", f"launch {j}")
            launches.append(([r.add(e, *at, f"grid[{k}]") for k, e in enumerate(ln.grid)],
                             [r.add(e, *at, f"block[{k}]") for k, e in enumerate(ln.block)],
                             r.add(ln.shared_mem, *at, "shared_mem"),
                             r.add(ln.count, *at, "count") if ln.count is not None else -1,
                             [r.add(a.value, *at, f"arg {k}") if a.value is not None else 0
                              for k, a in enumerate(ln.args)]))
        variant_roots.append((pred, scratch, launches))
    r.finish()

    params = []
    for p, (dims, value) in zip(s.params, param_roots):
        name = text(b, p.name, f"program {s.name!r}: parameter name")
        shape = u32_vector(b, [r[d] for d in dims]) if isinstance(p, Tensor) else None
        FParam.Start(b)
        FParam.AddKind(b, 0 if isinstance(p, Tensor) else 1)
        FParam.AddName(b, name)
        FParam.AddDtype(b, p.dtype.code)
        if isinstance(p, Tensor):
            FParam.AddRole(b, ROLES.index(p.role))
            FParam.AddZeroInit(b, p.zero_init)
            FParam.AddShape(b, shape)
        elif value >= 0:
            FParam.AddValue(b, r[value])
        params.append(FParam.End(b))
    constraints = []
    for c, root in zip(s.constraints, constraint_roots):
        message = text(b, c.message, f"program {s.name!r}: constraint message")
        FConstraint.Start(b)
        FConstraint.AddPredicate(b, r[root])
        FConstraint.AddMessage(b, message)
        constraints.append(FConstraint.End(b))
    variants = []
    for v, (pred, scratch_roots, launch_roots) in zip(s.variants, variant_roots):
        scratch_tables = []
        for sc, dims in zip(v.scratch, scratch_roots):
            name = text(b, sc.name, f"program {s.name!r}: scratch name")
            shape = u32_vector(b, [r[d] for d in dims])
            FScratch.Start(b)
            FScratch.AddName(b, name)
            FScratch.AddDtype(b, sc.dtype.code)
            FScratch.AddShape(b, shape)
            FScratch.AddZeroInit(b, sc.zero_init)
            scratch_tables.append(FScratch.End(b))
        launch_tables = []
        for ln, (grid, block, smem, count, arg_roots) in zip(v.launches, launch_roots):
            args = []
            for a, root in zip(ln.args, arg_roots):
                name = text(b, a.name, f"program {s.name!r}: launch argument name")
                FArg.Start(b)
                FArg.AddKind(b, ARG_KINDS.index(a.kind))
                FArg.AddName(b, name)
                if a.kind == "value":
                    FArg.AddValue(b, r[root])
                    FArg.AddDtype(b, a.dtype.code)  # type: ignore[union-attr]
                args.append(FArg.End(b))
            where = f"program {s.name!r}: launch"
            kernel = text(b, ln.kernel, f"{where} kernel")
            module = text(b, ln.module, f"{where} module")
            loop, args_vec = text(b, ln.loop, f"{where} loop symbol"), offset_vector(b, args)
            elsewhere = string_vector(b, ln.reads_elsewhere, f"{where} reads_elsewhere") \
                if ln.reads_elsewhere else 0  # (absent: 1.0 readers see the same table)
            FLaunch.Start(b)
            FLaunch.AddKernel(b, kernel)
            FLaunch.AddModule(b, module)
            FLaunch.AddGrid(b, FDim3.CreateDim3(b, *(r[x] for x in grid)))
            FLaunch.AddBlock(b, FDim3.CreateDim3(b, *(r[x] for x in block)))
            FLaunch.AddSharedMem(b, r[smem])
            if count >= 0:
                FLaunch.AddCount(b, r[count])
            FLaunch.AddLoop(b, loop)
            FLaunch.AddArgs(b, args_vec)
            if elsewhere:
                FLaunch.AddReadsElsewhere(b, elsewhere)
            if ln.stores_after_loads:
                FLaunch.AddStoresAfterLoads(b, True)
            launch_tables.append(FLaunch.End(b))
        scratch_vec, launch_vec = offset_vector(b, scratch_tables), offset_vector(b, launch_tables)
        FVariant.Start(b)
        if pred >= 0:
            FVariant.AddPredicate(b, r[pred])
        FVariant.AddScratch(b, scratch_vec)
        FVariant.AddLaunches(b, launch_vec)
        variants.append(FVariant.End(b))

    enc = r.encoded
    name = text(b, s.name, "program name")
    symbols = string_vector(b, enc.symbols, f"program {s.name!r}: symbol")
    ops, imms = byte_vector(b, enc.ops), i64_vector(b, enc.imms)
    vecs = [offset_vector(b, params), offset_vector(b, constraints), offset_vector(b, variants)]
    FProgram.Start(b)
    FProgram.AddName(b, name)
    FProgram.AddSymbols(b, symbols)
    FProgram.AddOps(b, ops)
    FProgram.AddImms(b, imms)
    FProgram.AddParams(b, vecs[0])
    FProgram.AddConstraints(b, vecs[1])
    FProgram.AddVariants(b, vecs[2])
    return FProgram.End(b)


def image_table(b: flatbuffers.Builder, image: Image, blob: int, codec: int, stored: bytes) -> int:
    """The ``ImageMeta`` of ``image``, whose ``stored`` bytes (compressed with ``codec``) are
    blob number ``blob``."""
    toolchain = text(b, image.toolchain, f"image {image.target}: toolchain")
    digest = byte_vector(b, hashlib.sha256(stored).digest())
    raw_digest = byte_vector(b, hashlib.sha256(image.data).digest())
    FImage.Start(b)
    FImage.AddKind(b, IMAGE_KINDS.index(image.kind))
    FImage.AddArchMajor(b, image.arch.major)
    FImage.AddArchMinor(b, image.arch.minor)
    FImage.AddArchSuffix(b, ARCH_SUFFIXES.index(image.arch.suffix))
    if image.ptx_isa is not None:
        FImage.AddPtxIsa(b, FVersion.CreateVersion(b, *image.ptx_isa))
    FImage.AddCudaVersion(b, image.cuda_version)
    FImage.AddToolchain(b, toolchain)
    FImage.AddCodec(b, codec)
    FImage.AddRawSize(b, len(image.data))
    FImage.AddDigest(b, digest)
    FImage.AddRawDigest(b, raw_digest)
    FImage.AddBlob(b, blob)
    return FImage.End(b)
