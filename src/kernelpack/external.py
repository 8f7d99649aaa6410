"""``kp.external``: wrap kernels that kernelpack did not generate — existing PTX, cubins, LLVM IR
or CUDA C — behind a declared summary, so they are saved, verified, planned and launched like
compiled ones.

The user states what the lowering would otherwise infer: the parameters (with symbolic shapes),
the launch configuration as expressions over the symbols, and how kernel arguments bind to
parameters. kernelpack checks what it can check without a GPU: the entry exists in the PTX or
the cubin, the PTX assembles for every requested architecture (nvJitLink, which needs no
driver), CUDA C compiles for every target (NVRTC, likewise driverless: see
:mod:`kernelpack.toolchain.nvrtc`), a cubin is an ELF file for the CUDA machine built for the
architecture it is declared for, and the summary is self-consistent (every symbol bound, every
argument names a parameter).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, Union

from ._warn import warn_caller
from .dtypes import as_dtype
from .limits import MAX_LAUNCH_REPEAT
from .errors import CompileError
from .expr import Expr, ExprLike
from .compiled import Compiled, Module
from ._plan_types import MAX_BLOCK_THREADS, MAX_GRID_X, MAX_GRID_YZ, block_fits, dtype_range
from .summary import (Arg, Constraint, KernelSummary, Launch, Param, Scalar, Scratch, Tensor,
                      Variant)
from .summary import _name as check_name
from .targets import parse_target_list

if TYPE_CHECKING:  # the scanners are read on first use (see __getattr__)
    from .external_images import cubin_arch, cubin_entries, ptx_entries, read_source

__all__ = ["external", "read_source", "ptx_entries", "cubin_entries", "cubin_arch"]

# Read from the sources' module on first use (PEP 562): a PTX/cubin scanner and its regular
# expressions are ~1.5 ms of ``import kernelpack``, which imports this module for kp.external
# but needs none of it to load and launch.
_FROM_IMAGES = frozenset(("read_source", "ptx_entries", "cubin_entries", "cubin_arch"))
# targets= when none is given (a cubin dict's keys are its targets instead)
DEFAULT_TARGETS = ("sm_80", "sm_90")


def __getattr__(name: str) -> Any:
    if name in _FROM_IMAGES:
        from . import external_images

        value = getattr(external_images, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

Dim3Like = Union[ExprLike, Sequence[ExprLike]]
# a source given as text, bytes or a path (external_images.PtxSource; not imported from there,
# which is read on first use, so that the annotations resolve at run time)
PtxSource = Union[str, bytes, "os.PathLike[str]"]
ArgLike = Union[Arg, str, tuple]
_PTX_TYPED_RE = re.compile(r"\.([fsu])(?:8|16|32|64)\b")  # .f32, .u64, .s8: not .b32, .pred



def external(name: str, entry: str, params: Sequence[Param], grid: Dim3Like, block: Dim3Like,
             shared_mem: ExprLike = 0, *, ptx: PtxSource | None = None,
             cubin: bytes | Mapping[str, bytes] | None = None,
             llvm_ir: PtxSource | None = None, cuda: PtxSource | None = None,
             nvrtc_options: Sequence[str] = (), headers: Mapping[str, str | bytes] | None = None,
             targets: Sequence[str] | None = None, args: Sequence[ArgLike] | None = None,
             module: str | None = None, constraints: Iterable[object] = (),
             scratch: Sequence[Scratch] = (), count: ExprLike | None = None,
             loop: str = "", reads_elsewhere: Iterable[str] = (),
             stores_after_loads: bool = False) -> Compiled:
    """Declare a program made of one launch of an existing kernel.

    Parameters
    ----------
    name:
        The program name (what ``pack[name]`` finds).
    entry:
        The kernel's entry name, as in ``.entry NAME`` of the PTX (mangled, if C++). With
        ``cuda=``, a C++ name expression is accepted too (see ``cuda``).
    params:
        :class:`~kernelpack.Tensor` / :class:`~kernelpack.Scalar` in call order.
    grid, block, shared_mem:
        Launch dimensions: ints, symbol names or expressions (``kp.cdiv("n", 256)``); grid and
        block take 1 to 3 dimensions.
    ptx:
        PTX text (``str``/``bytes``) or a path to a ``.ptx`` file. Assembled with nvJitLink into
        a cubin per ``sm_XY`` target; kept as a ``ptx`` image when ``"ptx"`` (or a
        ``compute_XY``) is in ``targets`` — for the PTX's own ``.target``, since that is what
        it can be JIT-compiled for. The PTX image records its ISA (``.version``) and
        ``cuda_version=0``: no toolkit of ours produced it.
    cubin:
        Instead of ``ptx``: cubin bytes (``targets`` must then name exactly one ``sm_XY``) or a
        dict ``{"sm_90": bytes, ...}``, whose keys are the targets (a ``targets=`` given with
        it must name the same architectures and no PTX: a ValueError says what differs).
    llvm_ir:
        Instead of ``ptx``: LLVM IR text or a path, for the ``nvptx64-nvidia-cuda`` triple with
        the kernel marked in ``!nvvm.annotations``. Emitted as PTX for the lowest ``sm_XY`` of
        ``targets`` (without its ``a``/``f`` suffix when the targets name several
        architectures) with llvmlite (imported only here), then handled like ``ptx``. The IR must
        be self-contained: no libdevice is linked.
    cuda:
        Instead of ``ptx``: CUDA C/C++ source text (``str``/``bytes``) or a path to a ``.cu``
        file, compiled with NVRTC (``nvidia-cuda-nvrtc``, in ``kernelpack[compile]``; imported
        only here): a cubin per ``sm_XY`` target straight from NVRTC, and PTX for the lowest
        architecture of ``targets`` when ``"ptx"`` is in them (as for ``llvm_ir``, without
        its ``a``/``f`` suffix when the targets span several architectures; for each explicit
        ``compute_XY``, that one), recording its ISA and target like ``ptx=``. Every image
        records the toolchain (``"NVRTC 13.5"``) and its CUDA version. An ``extern "C"``
        entry is named as written; a C++ kernel by a name expression (``entry="scale<float>"``,
        ``"ns::k"``, ``"(void(*)(float*))k"``), which NVRTC lowers to the mangled name that
        the program then records as its entry. ``#include "..."`` finds headers only through
        ``-I`` options (NVRTC's search of the current directory is switched off, so the bytes
        do not depend on where the call runs; except with ``-lineinfo`` or ``-G``, whose
        debug information holds the included files' absolute paths).
    nvrtc_options:
        Extra NVRTC flags for ``cuda=`` (``["-DBLOCK=256", "--use_fast_math", "-std=c++17"]``).
        Flags that set the architecture or the output kind (``-arch``, ``-rdc``, ``-dlto``,
        ...) are refused: the targets decide them.
    headers:
        For ``cuda=``: ``{"defs.h": text, ...}``, files that ``#include "defs.h"`` finds
        without ``-I`` (the source's headers given as text: nothing is read from disk).
    targets:
        What to build: ``sm_XY[a|f]`` cubins, ``"ptx"``, ``compute_XY`` (see ``ptx`` and
        ``cuda``); default ``["sm_80", "sm_90"]``.
    args:
        The kernel's arguments in order. Default: every parameter in order (a tensor binds its
        device pointer, a scalar its value). Items are :class:`~kernelpack.Arg`, a parameter or
        scratch name, or an ``(expression, dtype)`` tuple passing a computed integer.
    module:
        Name of the module (image group); defaults to the program name.
    constraints:
        :class:`~kernelpack.Constraint`, a predicate expression, or ``(predicate, message)``.
    scratch:
        Global workspace buffers the kernel needs (:class:`~kernelpack.Scratch`).
    count, loop:
        Repeat the launch ``count`` times; ``loop`` names the counter symbol (0, 1, ...).
    reads_elsewhere:
        Names of tensor parameters (or scratch buffers) the kernel may read at elements
        other than the ones it stores (a transpose, a stencil, a matrix product): a call
        that passes an output over such an input in place then reads it from a copy.
        Without them the kernel is trusted to read each input element only to compute the
        output elements stored over it (:class:`~kernelpack.Launch`; format 1.1).
    stores_after_loads:
        True when each thread loads everything it reads before it stores anything: a kernel
        storing several arrays may then have each over an input in place (an optimizer
        step's ``out=(p, m)``); otherwise such a call reads the inputs from copies.

    Returns
    -------
    A :class:`~kernelpack.Compiled` with ``origin="external"``, ready for ``kp.save``.

    Raises
    ------
    CompileError
        The entry is missing, the PTX does not assemble (or a target is below its
        ``.target``), the CUDA C does not compile (or
        NVRTC is not installed), or a cubin is not a CUDA ELF for its declared architecture
        (nvJitLink's or NVRTC's log is attached).
    TypeError, ValueError
        Misuse: not exactly one of ``ptx``/``cubin``/``llvm_ir``/``cuda``, a bad target, a
        forbidden NVRTC option, an inconsistent summary, or kernel arguments that do not
        match the entry's parameter list (read from the PTX, the cubins, or what NVRTC made)
        in number. An argument whose width differs from its ``.param`` (an ``f64`` scalar for
        a ``.f32``), or a float for an integer ``.param`` or the reverse, is a UserWarning
        (signedness and untyped ``.b``/byte-array parameters are not compared).
    """
    check_name(name, "program name")  # before the module name, which defaults to it
    if not isinstance(entry, str) or not entry:
        raise TypeError(f"entry must be the kernel's entry name (got {entry!r})")
    given = [k for k, v in (("ptx", ptx), ("cubin", cubin), ("llvm_ir", llvm_ir), ("cuda", cuda))
             if v is not None]
    if len(given) != 1:
        raise TypeError("kp.external needs exactly one kernel source: ptx=, cubin=, llvm_ir= or "
                        f"cuda= (got {', '.join(given) or 'none'})")
    # Read once, here: a generator would be exhausted by the first of the several passes below.
    targets_given = targets is not None
    targets = _sequence(DEFAULT_TARGETS if targets is None else targets, "targets")
    nvrtc_flags: tuple[str, ...] = ()
    header_texts: tuple[tuple[str, bytes], ...] = ()
    if cuda is not None:
        # light: cuda.bindings loads on the first compile
        from .toolchain.nvrtc import check_headers, check_options

        nvrtc_flags = check_options(nvrtc_options)
        header_texts = check_headers(headers)
    elif nvrtc_options:
        raise TypeError(f"nvrtc_options= applies only to cuda= (got it with {given[0]}=)")
    elif headers:
        raise TypeError(f"headers= applies only to cuda= (got it with {given[0]}=)")
    module_name = name if module is None else module
    params = _sequence(params, "params")
    for p in params:
        if not isinstance(p, (Tensor, Scalar)):
            raise TypeError(f"params must be kp.Tensor or kp.Scalar (got {p!r})")
    scratch = _sequence(scratch, "scratch")
    for s in scratch:
        if not isinstance(s, Scratch):
            raise TypeError(f"scratch items must be kp.Scratch (got {s!r})")
    bound_args = _bind_args(params, scratch, args)
    launch = Launch(kernel=entry, module=module_name, grid=grid, block=block,  # type: ignore[arg-type]
                    args=bound_args, shared_mem=shared_mem, count=count, loop=loop,
                    reads_elsewhere=reads_elsewhere, stores_after_loads=stores_after_loads)
    checked = tuple(_constraint(c) for c in _sequence(constraints, "constraints"))
    _check_evaluable(launch, params, checked, scratch)
    _check_constant_launch(launch)
    _check_constant_values(params, checked)

    def summary_of(launch: Launch) -> KernelSummary:
        return KernelSummary(name=name, params=params,
                             variants=(Variant(launches=(launch,), scratch=scratch),),
                             constraints=checked)

    summary = summary_of(launch)  # the summary is checked before any compiler runs
    from .external_images import (cubin_entry_params, images_from_cubins, images_from_cuda,
                                  images_from_ptx, ptx_entry_params, ptx_from_llvm_ir,
                                  read_source)

    kernel = entry
    ptx_toolchain = "external PTX"
    if llvm_ir is not None:
        ptx, ptx_toolchain = ptx_from_llvm_ir(read_source(llvm_ir, "llvm_ir"), targets)
    if cuda is not None:
        images, kernel = images_from_cuda(read_source(cuda, "cuda"), entry, targets,
                                           nvrtc_flags, program=f"{module_name}.cu",
                                           headers=header_texts)
        if kernel != entry:  # a C++ name expression: the program launches the mangled name
            summary = summary_of(dataclasses.replace(launch, kernel=kernel))
        # What NVRTC made of the C signature: one source, so the first image that says it
        # (PTX first: it names the types too, a cubin only the sizes) speaks for all.
        for image in sorted(images, key=lambda image: image.kind != "ptx"):
            declared = (ptx_entry_params(image.data, kernel) if image.kind == "ptx" else
                        cubin_entry_params(image.data, kernel))
            if declared is not None:
                _check_args_fit(declared, f"the kernel {kernel!r} of the {image.kind} for "
                                f"{image.target}", launch.args, params)
                break
        for image in images:
            _check_thread_limit(image, kernel, launch)
    elif ptx is not None:
        source = read_source(ptx, "ptx")
        _check_args_fit(ptx_entry_params(source, entry), f"the PTX entry {entry!r}",
                        launch.args, params)
        _check_thread_limit(source, entry, launch)
        images = images_from_ptx(source, entry, targets, ptx_toolchain)
    else:
        images = images_from_cubins(cubin, entry, targets)  # type: ignore[arg-type]
        if targets_given and isinstance(cubin, Mapping):
            _check_dict_targets([image.arch for image in images], targets)
        for image in images:
            _check_args_fit(cubin_entry_params(image.data, entry),
                            f"the kernel {entry!r} of the cubin for {image.arch.sm}",
                            launch.args, params)
            _check_thread_limit(image, entry, launch)
    mod = Module(name=module_name, kernels=(kernel,), images=tuple(images))
    return Compiled(summary=summary, modules=(mod,), origin="external")


def _check_dict_targets(held: list, targets: tuple) -> None:
    """``targets=`` beside ``cubin={...}`` (whose architectures are ``held``) must ask for
    what the dict holds: a target left out would be silently missing from the artifact (a
    CompatibilityError on that device, much later), and the dict has no PTX to keep."""
    archs, want_ptx = parse_target_list(targets)
    missing = sorted(str(a) for a in set(archs) - set(held))
    extra = sorted(str(a) for a in set(held) - set(archs))
    if want_ptx or missing or extra:
        parts = ([f"asks for {', '.join(missing)}, which the dict has no cubin for"] * bool(missing)
                 + [f"leaves out {', '.join(extra)}, which the dict holds"] * bool(extra)
                 + ["asks for PTX, which a cubin dict cannot give"] * want_ptx)
        raise ValueError(f"targets={list(targets)!r} {'; '.join(parts)}: with cubin={{...}} "
                         f"the dict's keys are the targets (leave targets= out)")


# ---- summary pieces ----------------------------------------------------------------------------
def _sequence(value: object, what: str) -> tuple:
    """A list argument as a tuple. A bare item (a str, a kp.Tensor, an expression, a dict,
    None) would otherwise be iterated into nonsense or fail with Python's own "object is not
    iterable", which does not say which argument was wrong."""
    if isinstance(value, (str, bytes, Mapping, Expr, Tensor, Scalar, Scratch, Constraint, Arg)):
        raise TypeError(f"{what} must be a list (got {value!r:.80})")
    try:
        return tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be a list (got {value!r:.80})") from None


def _check_evaluable(launch: Launch, params: tuple[Param, ...],
                     constraints: tuple[Constraint, ...], scratch: tuple[Scratch, ...]) -> None:
    """An expression that reads no symbol but was not folded to a number cannot be evaluated
    (``kp.shl(1, 64)``, ``kp.cdiv(1, 0)``: folding keeps what would fail): ValueError naming
    its field now, instead of an ExpressionError from every plan."""
    from .errors import ExpressionError
    from .expr_eval import evaluate

    fields: list[tuple[str, Expr]] = [*zip(("grid.x", "grid.y", "grid.z"), launch.grid),
                                      *zip(("block.x", "block.y", "block.z"), launch.block),
                                      ("shared_mem", launch.shared_mem)]
    if launch.count is not None:
        fields.append(("count", launch.count))
    fields += [(f"args[{i}]", a.value) for i, a in enumerate(launch.args)
               if a.value is not None]
    fields += [(f"computed scalar {p.name!r}", p.value) for p in params
               if isinstance(p, Scalar) and p.value is not None]
    fields += [(f"constraint {c.message or ''!r:.60}", c.predicate) for c in constraints]
    fields += [(f"scratch {sc.name!r} shape[{i}]", d) for sc in scratch
               for i, d in enumerate(sc.shape)]
    for what, e in fields:
        if e.is_const or e.symbols():
            continue
        try:
            evaluate(e, {})
        except ExpressionError as exc:
            raise ValueError(f"{what} = {e} reads no symbol but cannot be evaluated ({exc}): "
                             f"every call would be refused") from None


def _check_constant_launch(launch: Launch) -> None:
    """Constant launch dimensions are checked against CUDA's limits now, not at the first plan,
    which would refuse every call (a symbolic dimension is checked by every plan)."""
    block = launch.block
    if all(d.is_const for d in block):
        sizes = tuple(int(d.value) for d in block)  # type: ignore[arg-type]
        if not block_fits(*sizes):
            raise ValueError(f"block {sizes}: CUDA needs every dim >= 1 (x, y <= 1024, "
                             f"z <= 64) and at most {MAX_BLOCK_THREADS} threads in all")
    for axis, d, limit in zip("xyz", launch.grid, (MAX_GRID_X, MAX_GRID_YZ, MAX_GRID_YZ)):
        if d.is_const and not 0 <= int(d.value) <= limit:  # type: ignore[arg-type]
            raise ValueError(f"grid.{axis} = {d.value}: CUDA needs 0..{limit}")
    smem = launch.shared_mem
    if smem.is_const and not 0 <= int(smem.value) < (1 << 32):  # type: ignore[arg-type]
        raise ValueError(f"shared_mem = {smem.value}: expected 0..2^32-1 bytes")
    count = launch.count
    if count is not None and count.is_const and not (
            0 <= int(count.value) <= MAX_LAUNCH_REPEAT):  # type: ignore[arg-type]
        raise ValueError(f"count = {count.value}: expected 0..{MAX_LAUNCH_REPEAT} repeats")
    for i, arg in enumerate(launch.args):
        if arg.kind == "value" and arg.value.is_const:  # type: ignore[union-attr]
            _check_fits(int(arg.value.value), arg.dtype, f"args[{i}]")  # type: ignore


def _check_thread_limit(code: object, kernel: str, launch: Launch) -> None:
    """A constant block above the kernel's own thread limit (``.maxntid``/``.reqntid`` in PTX,
    ``__launch_bounds__``, read from PTX text or an image: PTX or cubin) is refused now: the
    driver would refuse every launch of it."""
    from .code_scan import cubin_entry_max_threads, ptx_entry_max_threads

    if not all(d.is_const for d in launch.block):
        return
    if isinstance(code, (bytes, bytearray)):
        declared, where = ptx_entry_max_threads(bytes(code), kernel), "PTX"
    elif getattr(code, "kind", None) == "ptx":
        declared, where = ptx_entry_max_threads(code.data, kernel), "PTX"  # type: ignore
    elif getattr(code, "kind", None) == "cubin":
        declared = cubin_entry_max_threads(code.data, kernel)  # type: ignore[attr-defined]
        where = f"cubin for {code.arch.sm}"  # type: ignore[attr-defined]
    else:
        return
    if declared is None:
        return
    sizes = tuple(int(d.value) for d in launch.block)  # type: ignore[arg-type]
    threads = sizes[0] * sizes[1] * sizes[2]
    if threads > declared[1]:
        raise ValueError(f"block {sizes} is {threads} threads, but the kernel {kernel!r} "
                         f"declares {declared[0]} in its {where} (at most {declared[1]} "
                         f"threads per block): every launch would fail")


def _check_constant_values(params: tuple[Param, ...], constraints: tuple[Constraint, ...]) -> None:
    """A constant computed scalar must fit its dtype and a constant constraint must hold: as
    for constant launch dimensions, every plan would otherwise refuse every call."""
    for p in params:
        if isinstance(p, Scalar) and p.value is not None and p.value.is_const and (
                p.dtype.is_integer or p.dtype.kind == "b"):
            _check_fits(int(p.value.value), p.dtype,  # type: ignore[arg-type]
                        f"computed scalar {p.name!r}")
    for c in constraints:
        if c.predicate.is_const and not c.predicate.value:
            raise ValueError(f"constraint {c.message or c.predicate!s:.80} is always false: "
                             f"every call would be refused")


def _check_fits(value: int, dtype: object, what: str) -> None:
    lo, hi = dtype_range(dtype)  # type: ignore[arg-type]
    if not lo <= value <= hi:
        raise ValueError(f"{what} = {value} does not fit {dtype} ({lo}..{hi})")


def _bind_args(params: tuple[Param, ...], scratch: tuple[Scratch, ...],
               args: Sequence[ArgLike] | None) -> tuple[Arg, ...]:
    """Turn the user's argument list into :class:`Arg` s (default: every parameter in order)."""
    if args is None:
        return tuple(Arg.buffer(p.name) if isinstance(p, Tensor) else Arg.scalar(p.name)
                     for p in params)
    if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, Iterable):
        raise TypeError(f"args must be a sequence of arguments (got {args!r:.80})")
    buffers = {p.name for p in params if isinstance(p, Tensor)} | {s.name for s in scratch}
    scalars = {p.name for p in params if isinstance(p, Scalar)}
    out: list[Arg] = []
    for i, item in enumerate(args):
        if isinstance(item, Arg):
            out.append(item)
        elif isinstance(item, str):
            if item in buffers:
                out.append(Arg.buffer(item))
            elif item in scalars:
                out.append(Arg.scalar(item))
            else:
                raise ValueError(f"args[{i}]: {item!r:.80} is neither a parameter nor a "
                                 f"scratch buffer "
                                 f"(known: {sorted(buffers | scalars)})")
        elif isinstance(item, tuple) and len(item) == 2:
            value, dtype = item
            out.append(Arg.of(value, as_dtype(dtype)))
        else:
            raise TypeError(f"args[{i}] must be a kp.Arg, a parameter name or an "
                            f"(expression, dtype) tuple (got {item!r})")
    return tuple(out)


def _check_args_fit(declared: list[tuple[str, int]] | None, kernel: str,
                    args: tuple[Arg, ...], params: tuple[Param, ...]) -> None:
    """The kernel arguments must match the parameters ``declared`` by the code (the PTX
    entry's ``.param`` list, a cubin's parameter info; None: unknown). The runtime hands
    cuLaunchKernel one pointer per argument and the driver reads one per declared parameter:
    with fewer arguments it reads pointers past the array (garbage, or a crash of the host
    process), so a count mismatch is an error.

    The rule for each argument (a buffer is a 64-bit pointer; a scalar or value argument has
    its dtype's size): its size must equal the parameter's (``.u64``/``.b64``/``.s64`` for a
    pointer; ``.b8 p[N]`` is N bytes whatever its ``.align``; a cubin gives sizes only), and
    a float (or complex) must meet a ``.f`` type, an integer, bool or pointer a ``.u``/``.s``
    one; an untyped ``.b``/``.pred``/byte-array parameter takes either kind, and signedness
    never matters (a ``u32`` for ``.s32`` passes the same bits). A mismatch (an ``f64`` for a
    ``.f32``, an ``i64`` for a ``.u32``, an ``f32`` for a ``.u32``) gives garbage values on
    the GPU but reads nothing out of bounds of the argument array, and programs that are only
    saved or planned declare such summaries: a warning, not an error. A ``.param`` list this
    reader does not understand is not checked."""
    if declared is None:
        return
    if len(declared) != len(args):
        raise ValueError(f"args: {len(args)} kernel argument(s) for {kernel}, "
                         f"which declares {len(declared)} parameter(s) "
                         f"{[decl for decl, _ in declared]!r:.300}")
    dtypes = {p.name: p.dtype for p in params if isinstance(p, Scalar)}
    for i, (arg, (decl, size)) in enumerate(zip(args, declared)):
        if arg.kind == "buffer":
            have, is_float, what = 8, False, f"buffer {arg.name!r} (a 64-bit device pointer)"
        else:  # KernelSummary.check() ran: every scalar arg is known; a value one has a dtype
            dtype = dtypes[arg.name] if arg.kind == "scalar" else arg.dtype
            what = f"scalar {arg.name!r} ({dtype})" if arg.kind == "scalar" else \
                f"value argument ({dtype})"
            have, is_float = dtype.itemsize, dtype.kind in "fc"  # type: ignore[union-attr]
        typed = _PTX_TYPED_RE.search(decl)  # None: a cubin's or an untyped parameter
        if have != size:
            warn_caller(f"kp.external: args[{i}]: {what} is {have} byte(s), but {kernel} "
                        f"declares {decl!r} ({size} bytes): a launch passes the kernel a "
                        f"wrong value")
        elif typed is not None and (typed.group(1) == "f") != is_float:
            kinds = ("an integer", "a float")
            warn_caller(f"kp.external: args[{i}]: {what} is {kinds[is_float]}, but {kernel} "
                        f"declares {decl!r}: a launch passes the kernel its bits as "
                        f"{kinds[not is_float]}")


def _constraint(item: object) -> Constraint:
    if isinstance(item, Constraint):
        return item
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
        return Constraint(item[0], item[1])  # (its errors name the constraint)
    if isinstance(item, (Expr, str)):
        return Constraint(item)
    raise TypeError(f"a constraint must be a kp.Constraint, a predicate expression or "
                    f"(predicate, message) (got {item!r})")
