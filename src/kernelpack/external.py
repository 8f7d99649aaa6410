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
import struct
from pathlib import Path
from typing import Iterable, Mapping, Sequence, Union

from .dtypes import as_dtype
from .errors import CompileError
from .expr import Expr, ExprLike, as_expr
from .compiled import Compiled, Image, Module
from ._plan_types import MAX_BLOCK_THREADS, block_fits
from .summary import (Arg, Constraint, KernelSummary, Launch, Param, Scalar, Scratch, Tensor,
                      Variant)
from .summary import _name as check_name
from .targets import Arch, parse_arch, parse_target_list

__all__ = ["external", "read_source", "ptx_entries", "cubin_entries", "cubin_arch"]

PtxSource = Union[str, bytes, os.PathLike]
Dim3Like = Union[ExprLike, Sequence[ExprLike]]
ArgLike = Union[Arg, str, tuple]

_ENTRY_RE = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$]*)")
_ELF_MAGIC = b"\x7fELF"
_EM_CUDA = 190
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10


def external(name: str, entry: str, params: Sequence[Param], grid: Dim3Like, block: Dim3Like,
             shared_mem: ExprLike = 0, *, ptx: PtxSource | None = None,
             cubin: bytes | Mapping[str, bytes] | None = None,
             llvm_ir: PtxSource | None = None, cuda: PtxSource | None = None,
             nvrtc_options: Sequence[str] = (),
             targets: Sequence[str] = ("sm_80", "sm_90"), args: Sequence[ArgLike] | None = None,
             module: str | None = None, constraints: Iterable[object] = (),
             scratch: Sequence[Scratch] = (), count: ExprLike | None = None,
             loop: str = "") -> Compiled:
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
        dict ``{"sm_90": bytes, ...}`` (``targets`` is ignored).
    llvm_ir:
        Instead of ``ptx``: LLVM IR text or a path, for the ``nvptx64-nvidia-cuda`` triple with
        the kernel marked in ``!nvvm.annotations``. Emitted as PTX for the lowest ``sm_XY`` of
        ``targets`` with llvmlite (imported only here), then handled like ``ptx``. The IR must
        be self-contained: no libdevice is linked.
    cuda:
        Instead of ``ptx``: CUDA C/C++ source text (``str``/``bytes``) or a path to a ``.cu``
        file, compiled with NVRTC (``nvidia-cuda-nvrtc``, in ``kernelpack[compile]``; imported
        only here): a cubin per ``sm_XY`` target straight from NVRTC, and PTX for the lowest
        architecture of ``targets`` when ``"ptx"`` is in them (for each explicit
        ``compute_XY``, that one), recording its ISA and target like ``ptx=``. Every image
        records the toolchain (``"NVRTC 13.5"``) and its CUDA version. An ``extern "C"``
        entry is named as written; a C++ kernel by a name expression (``entry="scale<float>"``,
        ``"ns::k"``, ``"(void(*)(float*))k"``), which NVRTC lowers to the mangled name that
        the program then records as its entry. ``#include "..."`` finds headers only through
        ``-I`` options (NVRTC's search of the current directory is switched off, so the bytes
        do not depend on where the call runs).
    nvrtc_options:
        Extra NVRTC flags for ``cuda=`` (``["-DBLOCK=256", "--use_fast_math", "-std=c++17"]``).
        Flags that set the architecture or the output kind (``-arch``, ``-rdc``, ``-dlto``,
        ...) are refused: the targets decide them.
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

    Returns
    -------
    A :class:`~kernelpack.Compiled` with ``origin="external"``, ready for ``kp.save``.

    Raises
    ------
    CompileError
        The entry is missing, the PTX does not assemble, the CUDA C does not compile (or
        NVRTC is not installed), or a cubin is not a CUDA ELF for its declared architecture
        (nvJitLink's or NVRTC's log is attached).
    TypeError, ValueError
        Misuse: not exactly one of ``ptx``/``cubin``/``llvm_ir``/``cuda``, a bad target, a
        forbidden NVRTC option, an inconsistent summary.
    """
    check_name(name, "program name")  # before the module name, which defaults to it
    if not isinstance(entry, str) or not entry:
        raise TypeError(f"entry must be the kernel's entry name (got {entry!r})")
    given = [k for k, v in (("ptx", ptx), ("cubin", cubin), ("llvm_ir", llvm_ir), ("cuda", cuda))
             if v is not None]
    if len(given) != 1:
        raise TypeError("kp.external needs exactly one kernel source: ptx=, cubin=, llvm_ir= or "
                        f"cuda= (got {', '.join(given) or 'none'})")
    nvrtc_flags: tuple[str, ...] = ()
    if cuda is not None:
        from .toolchain.nvrtc import check_options  # light: cuda.bindings loads on first compile

        nvrtc_flags = check_options(nvrtc_options)
    elif nvrtc_options:
        raise TypeError(f"nvrtc_options= applies only to cuda= (got it with {given[0]}=)")
    module_name = name if module is None else module
    params = tuple(params)
    for p in params:
        if not isinstance(p, (Tensor, Scalar)):
            raise TypeError(f"params must be kp.Tensor or kp.Scalar (got {p!r})")
    scratch = tuple(scratch)
    for s in scratch:
        if not isinstance(s, Scratch):
            raise TypeError(f"scratch items must be kp.Scratch (got {s!r})")
    bound_args = _bind_args(params, scratch, args)
    launch = Launch(kernel=entry, module=module_name, grid=grid, block=block,  # type: ignore[arg-type]
                    args=bound_args, shared_mem=as_expr(shared_mem), count=count, loop=loop)
    _check_constant_block(launch.block)
    checked = tuple(_constraint(c) for c in constraints)

    def summary_of(launch: Launch) -> KernelSummary:
        return KernelSummary(name=name, params=params,
                             variants=(Variant(launches=(launch,), scratch=scratch),),
                             constraints=checked)

    summary = summary_of(launch)  # the summary is checked before any compiler runs
    kernel = entry
    ptx_toolchain = "external PTX"
    if llvm_ir is not None:
        ptx, ptx_toolchain = _ptx_from_llvm_ir(read_source(llvm_ir, "llvm_ir"), targets)
    if cuda is not None:
        images, kernel = _images_from_cuda(read_source(cuda, "cuda"), entry, targets,
                                           nvrtc_flags, program=f"{name}.cu")
        if kernel != entry:  # a C++ name expression: the program launches the mangled name
            summary = summary_of(dataclasses.replace(launch, kernel=kernel))
    elif ptx is not None:
        images = _images_from_ptx(read_source(ptx, "ptx"), entry, targets, ptx_toolchain)
    else:
        images = _images_from_cubins(cubin, entry, targets)  # type: ignore[arg-type]
    mod = Module(name=module_name, kernels=(kernel,), images=tuple(images))
    return Compiled(summary=summary, modules=(mod,), origin="external")


# ---- summary pieces ----------------------------------------------------------------------------
def _check_constant_block(block: tuple[Expr, ...]) -> None:
    """A block whose dims are all constants is checked against CUDA's limits now, not at the
    first plan (a symbolic block is checked by every plan)."""
    if not all(d.is_const for d in block):
        return
    sizes = tuple(int(d.value) for d in block)
    if not block_fits(*(sizes + (1, 1))[:3]):
        raise ValueError(f"block {sizes}: CUDA needs every dim >= 1 (x, y <= 1024, z <= 64) and "
                         f"at most {MAX_BLOCK_THREADS} threads in all")


def _bind_args(params: tuple[Param, ...], scratch: tuple[Scratch, ...],
               args: Sequence[ArgLike] | None) -> tuple[Arg, ...]:
    """Turn the user's argument list into :class:`Arg` s (default: every parameter in order)."""
    if args is None:
        return tuple(Arg.buffer(p.name) if isinstance(p, Tensor) else Arg.scalar(p.name)
                     for p in params)
    if isinstance(args, (str, bytes)):
        raise TypeError(f"args must be a sequence of arguments (got {args!r})")
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
                raise ValueError(f"args[{i}]: {item!r} is neither a parameter nor a scratch buffer "
                                 f"(known: {sorted(buffers | scalars)})")
        elif isinstance(item, tuple) and len(item) == 2:
            value, dtype = item
            out.append(Arg.of(value, as_dtype(dtype)))
        else:
            raise TypeError(f"args[{i}] must be a kp.Arg, a parameter name or an "
                            f"(expression, dtype) tuple (got {item!r})")
    return tuple(out)


def _constraint(item: object) -> Constraint:
    if isinstance(item, Constraint):
        return item
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
        return Constraint(as_expr(item[0]), item[1])
    if isinstance(item, (Expr, str)):
        return Constraint(as_expr(item))
    raise TypeError(f"a constraint must be a kp.Constraint, a predicate expression or "
                    f"(predicate, message) (got {item!r})")


# ---- PTX ---------------------------------------------------------------------------------------
def read_source(source: PtxSource, what: str = "source") -> bytes:
    """Source text from a str/bytes or a file path. A str is text when it looks like code (has
    a newline, a PTX directive or ``__global__``), a path otherwise: file names never contain
    newlines."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source).rstrip(b"\0")
    if isinstance(source, str) and any(mark in source for mark in ("\n", ".entry", ".version",
                                                                    "define ", "__global__")):
        return source.encode().rstrip(b"\0")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            return path.read_bytes().rstrip(b"\0")
        except OSError as exc:
            raise ValueError(f"{what}: cannot read file {str(path)!r}: {exc.strerror}") from exc
    raise TypeError(f"{what} must be text (str/bytes) or a path (got {type(source).__name__})")


def _ptx_from_llvm_ir(ir: bytes, targets: Sequence[str]) -> tuple[str, str]:
    """LLVM IR → PTX with llvmlite's NVPTX backend, for the lowest requested architecture (so
    that nvJitLink can build every higher one from it)."""
    archs, _ = parse_target_list(targets)
    try:
        import llvmlite.binding as llvm
    except ImportError as exc:
        raise CompileError("llvm_ir= needs llvmlite: install kernelpack[compile]") from exc
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        module = llvm.parse_assembly(ir.decode("utf-8", "replace"))
        module.verify()
    except RuntimeError as exc:
        raise CompileError("llvm_ir: LLVM rejected the IR", str(exc)) from exc
    import llvmlite

    triple = "nvptx64-nvidia-cuda"
    if module.triple and module.triple != triple:
        raise CompileError(f"llvm_ir: target triple must be {triple!r} (got {module.triple!r})")
    module.triple = triple
    machine = llvm.Target.from_triple(triple).create_target_machine(cpu=archs[0].sm, opt=3)
    version = ".".join(str(v) for v in llvm.llvm_version_info)
    return machine.emit_assembly(module), f"LLVM {version} NVPTX (llvmlite {llvmlite.__version__})"


def ptx_entries(ptx: bytes) -> list[str]:
    """The kernel entry names declared in PTX text (``.entry NAME``), in order."""
    return [m.group(1).decode("ascii", "replace") for m in _ENTRY_RE.finditer(ptx)]


def _images_from_ptx(ptx: bytes, entry: str, targets: Sequence[str],
                     ptx_toolchain: str) -> list[Image]:
    from .toolchain import nvjitlink  # imports cuda.bindings lazily: only compilation needs it

    entries = ptx_entries(ptx)
    if entry not in entries:
        raise CompileError(f"kernel entry {entry!r} is not in the PTX (entries found: "
                           f"{entries or 'none'})")
    archs, want_ptx = parse_target_list(targets)
    toolchain, cuda = nvjitlink.toolchain_id(), nvjitlink.cuda_version()
    named = {t.strip().lower() for t in targets}
    images: list[Image] = []
    for arch in archs:
        if arch.compute in named and arch.sm not in named:
            continue  # "compute_80" without "sm_80" asks for PTX only
        data = nvjitlink.ptx_to_cubin(ptx, arch, name=f"{entry}.ptx")
        images.append(Image("cubin", arch, data, toolchain=toolchain, cuda_version=cuda))
    if want_ptx:
        # The PTX was written elsewhere: its provenance is its ISA (.version), which is what the
        # driver's JIT must support; cuda_version 0 says "no toolkit produced this image".
        images.append(nvjitlink.ptx_image(ptx, toolchain=ptx_toolchain))
    if not images:
        raise ValueError(f"targets {list(targets)!r} ask for no image")
    return images


# ---- CUDA C ------------------------------------------------------------------------------------
def _images_from_cuda(source: bytes, entry: str, targets: Sequence[str], options: tuple[str, ...],
                      program: str) -> tuple[list[Image], str]:
    """Compile CUDA C with NVRTC: a cubin per ``sm_XY`` target, PTX per PTX target (the lowest
    architecture for ``"ptx"``, as for ``llvm_ir=``; each explicit ``compute_XY``). Returns
    the images and the kernel's entry as the code names it (the mangled name for a C++ name
    expression)."""
    from .toolchain import nvjitlink, nvrtc  # nvjitlink only for ptx_image: no library load

    if b"\0" in source:
        raise ValueError("cuda: the source contains a NUL byte")
    archs, want_ptx = parse_target_list(targets)
    named = {t.strip().lower() for t in targets}
    jobs = [(arch, False) for arch in archs if not (arch.compute in named and arch.sm not in named)]
    if want_ptx:
        ptx_archs = {arch for arch in archs if arch.compute in named}
        if "ptx" in named:
            ptx_archs.add(archs[0])
        jobs += [(arch, True) for arch in sorted(ptx_archs)]
    expression = entry if nvrtc.needs_name_expression(entry) else None
    hint = ("" if expression is not None else
            "; a C++ kernel needs extern \"C\" or a name expression as entry ('k<float>')")
    toolchain, cuda_version = nvrtc.toolchain_id(), nvrtc.cuda_version()
    kernel: str | None = None
    images: list[Image] = []
    for arch, is_ptx in jobs:
        out = nvrtc.compile_program(source, arch, ptx=is_ptx, options=options,
                                    name_expression=expression, name=program)
        name = out.lowered_name or entry
        if kernel is not None and name != kernel:  # cannot happen for one source; be explicit
            raise CompileError(f"NVRTC lowered {entry!r} to {kernel!r} and to {name!r} for "
                               f"different targets")
        kernel = name
        if is_ptx:
            found = ptx_entries(out.data)
            if kernel not in found:
                raise CompileError(f"kernel entry {kernel!r} is not in the PTX for "
                                   f"{arch.compute} (entries found: {found or 'none'}){hint}")
            image = nvjitlink.ptx_image(out.data, toolchain=toolchain)
            if image.arch != arch:
                raise CompileError(f"NVRTC made PTX for {image.arch.compute}, not "
                                   f"{arch.compute}")
            images.append(dataclasses.replace(image, cuda_version=cuda_version))
        else:
            _check_cubin(out.data, arch, kernel, hint)
            images.append(Image("cubin", arch, out.data, toolchain=toolchain,
                                cuda_version=cuda_version))
    if kernel is None:
        raise ValueError(f"targets {list(targets)!r} ask for no image")
    return images, kernel


# ---- cubins ------------------------------------------------------------------------------------
def _images_from_cubins(cubin: bytes | Mapping[str, bytes], entry: str,
                        targets: Sequence[str]) -> list[Image]:
    if isinstance(cubin, Mapping):
        items = list(cubin.items())
        if not items:
            raise ValueError("cubin: the dict names no target")
    elif isinstance(cubin, (bytes, bytearray, memoryview)):
        sms = [t for t in targets if t != "ptx"]
        if len(sms) != 1 or "ptx" in targets:
            raise ValueError(f"cubin bytes need exactly one sm_XY target, or pass a dict "
                             f"{{'sm_90': bytes, ...}} (got targets={list(targets)!r})")
        items = [(sms[0], bytes(cubin))]
    else:
        raise TypeError(f"cubin must be bytes or a dict of target -> bytes "
                        f"(got {type(cubin).__name__})")
    images: list[Image] = []
    for target, data in items:
        if not isinstance(target, str) or not target.strip().lower().startswith("sm_"):
            raise ValueError(f"cubin target must be sm_XY (got {target!r})")
        arch = parse_arch(target)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"cubin for {arch.sm} must be bytes (got {type(data).__name__})")
        data = bytes(data)
        _check_cubin(data, arch, entry)
        images.append(Image("cubin", arch, data, toolchain="external cubin"))
    return images


def _check_cubin(data: bytes, arch: Arch, entry: str, hint: str = "") -> None:
    """A cubin must be a CUDA ELF built for ``arch`` that defines the kernel ``entry``."""
    built_for = cubin_arch(data, what=f"cubin for {arch.sm}")
    if built_for is not None and built_for != arch.major * 10 + arch.minor:
        raise CompileError(f"cubin declared as {arch.sm} was built for sm_{built_for}")
    found = cubin_entries(data, what=f"cubin for {arch.sm}")
    if entry not in found:
        raise CompileError(f"kernel entry {entry!r} is not in the cubin for {arch.sm} "
                           f"(entries found: {found or 'none'}){hint}")


def _elf_header(data: bytes, what: str) -> tuple[int, int, int, int]:
    """Check the ELF identification of a cubin; returns (shoff, shentsize, shnum, flags)."""
    if data[:4] != _ELF_MAGIC:
        raise CompileError(f"{what} is not an ELF file (starts with {data[:4]!r}, expected "
                           f"{_ELF_MAGIC!r}); pass PTX with ptx= instead")
    if len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise CompileError(f"{what} is not a 64-bit little-endian ELF file")
    machine = struct.unpack_from("<H", data, 18)[0]
    if machine != _EM_CUDA:
        raise CompileError(f"{what} is an ELF file for machine {machine}, not CUDA "
                           f"({_EM_CUDA})")
    (shoff,) = struct.unpack_from("<Q", data, 40)
    (flags,) = struct.unpack_from("<I", data, 48)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    return shoff, shentsize, shnum, flags


def cubin_arch(data: bytes, what: str = "cubin") -> int | None:
    """The SM number (90 for sm_90) a cubin was built for, from its ELF flags; None when the
    ELF ABI version is one this reader does not know."""
    _elf_header(data, what)
    abi = data[8]
    (flags,) = struct.unpack_from("<I", data, 48)
    if abi >= 8:
        return (flags >> 8) & 0xFF
    if abi == 7:
        return flags & 0xFF
    return None


def cubin_entries(data: bytes, what: str = "cubin") -> list[str]:
    """Kernel entry names of a cubin: function symbols marked as CUDA entries.

    Every offset is checked against the file size; a malformed ELF gives CompileError.
    """
    shoff, shentsize, shnum, _ = _elf_header(data, what)
    if shentsize < 64 or shoff + shnum * shentsize > len(data):
        raise CompileError(f"{what}: section header table outside the file")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    names: list[str] = []
    for _name, sh_type, _f, _a, offset, size, link, _i, _al, entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        if link >= shnum or offset + size > len(data) or entsize < 24:
            raise CompileError(f"{what}: malformed symbol table")
        str_off, str_size = sections[link][4], sections[link][5]
        if str_off + str_size > len(data):
            raise CompileError(f"{what}: string table outside the file")
        for pos in range(offset, offset + size - entsize + 1, entsize):
            st_name, info, other = struct.unpack_from("<IBB", data, pos)
            if info & 0xF != _STT_FUNC or not other & _STO_CUDA_ENTRY:
                continue
            if st_name >= str_size:
                raise CompileError(f"{what}: symbol name outside the string table")
            start = str_off + st_name
            end = data.find(b"\0", start, str_off + str_size)
            if end < 0:
                raise CompileError(f"{what}: unterminated symbol name")
            names.append(data[start:end].decode("ascii", "replace"))
    return names
