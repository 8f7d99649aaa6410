"""The images of :func:`kernelpack.external.external`'s sources: PTX assembled into cubins
with nvJitLink, NVPTX LLVM IR through LLVM's backend, CUDA C through NVRTC, and cubins checked
as ELF files for the CUDA machine (architecture and entry), all without a GPU.

Split from :mod:`kernelpack.external`, which builds the summary: this module holds what each
source kind needs to become checked images for the requested targets. What PTX text and cubins
declare (entries, parameters, a cubin's architecture) is read by :mod:`kernelpack.code_scan`;
those readers are importable from here too.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import Mapping, Sequence, Union

from .code_scan import cubin_arch, cubin_entries, cubin_entry_params, ptx_entries, ptx_entry_params
from .compiled import Image
from .errors import CompileError
from .limits import MAX_IMAGE_SIZE, MAX_NAME_LENGTH, fits_name
from .targets import Arch, parse_arch, parse_target_list, portable_lowest

__all__ = ["read_source", "ptx_entries", "ptx_entry_params", "cubin_entries", "cubin_arch",
           "cubin_entry_params", "images_from_ptx", "images_from_cuda", "images_from_cubins",
           "ptx_from_llvm_ir"]

PtxSource = Union[str, bytes, os.PathLike]

_CODE_MARKS = ("\n", ".entry", ".version", "define ", "__global__", "#include")
_BOM = b"\xef\xbb\xbf"


def _text(data: bytes) -> bytes:
    """Source bytes without a leading UTF-8 BOM or trailing NULs (C strings' terminators)."""
    return data[len(_BOM):].rstrip(b"\0") if data.startswith(_BOM) else data.rstrip(b"\0")


# ---- sources -----------------------------------------------------------------------------------
def read_source(source: PtxSource, what: str = "source") -> bytes:
    """Source text from a str/bytes or a file path. A str is text when it looks like code (has
    a newline, a PTX directive, ``__global__`` or ``#include``: a one-line ``.cu`` that
    includes its kernels from an ``-I`` directory), a path otherwise: file names never contain
    newlines. A leading UTF-8 byte order mark (editors on Windows write one) is dropped:
    NVRTC, nvJitLink and LLVM all reject it as a stray token."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _text(bytes(source))
    if isinstance(source, str) and not source.strip():
        # not a path: Path("") is the current directory, which would be reported instead
        raise ValueError(f"{what} is empty (expected source text or a file path)")
    if isinstance(source, str) and any(mark in source for mark in _CODE_MARKS):
        return _text(source.encode())
    if isinstance(source, (str, os.PathLike)):
        from pathlib import Path  # here: pathlib (with urllib.parse) is ~3 ms of an import

        path = Path(source)
        try:
            # a regular file of bounded size: a device or FIFO (/dev/zero, a pipe) would be
            # read forever or block
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{what}: {str(path)!r} is not a regular file")
            if st.st_size > MAX_IMAGE_SIZE:
                raise ValueError(f"{what}: {str(path)!r} has {st.st_size} bytes, more than "
                                 f"MAX_IMAGE_SIZE {MAX_IMAGE_SIZE}")
            return _text(path.read_bytes())
        except OSError as exc:
            raise ValueError(f"{what}: cannot read file {str(path)!r}: {exc.strerror}") from exc
    raise TypeError(f"{what} must be text (str/bytes) or a path (got {type(source).__name__})")


# ---- PTX and LLVM IR ---------------------------------------------------------------------------
def ptx_from_llvm_ir(ir: bytes, targets: Sequence[str]) -> tuple[str, str]:
    """LLVM IR → PTX with llvmlite's NVPTX backend, for the lowest requested architecture (so
    that nvJitLink can build every higher one from it). Its ``a``/``f`` suffix is dropped when
    the targets span several architectures: PTX for ``sm_90a`` cannot be built for ``sm_100``,
    while PTX for ``sm_90`` builds both."""
    archs, _ = parse_target_list(targets)
    lowest = portable_lowest(archs)
    from .toolchain import nvjitlink

    nvjitlink.check_archs(archs)  # before LLVM, which writes to stderr about an unknown one
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
    machine = llvm.Target.from_triple(triple).create_target_machine(cpu=lowest.sm, opt=3)
    version = ".".join(str(v) for v in llvm.llvm_version_info)
    return machine.emit_assembly(module), f"LLVM {version} NVPTX (llvmlite {llvmlite.__version__})"


def images_from_ptx(ptx: bytes, entry: str, targets: Sequence[str],
                     ptx_toolchain: str) -> list[Image]:
    from .toolchain import nvjitlink  # imports cuda.bindings lazily: only compilation needs it

    if b"\0" in ptx:
        raise ValueError("ptx: the PTX text contains a NUL byte")
    entries = ptx_entries(ptx)
    if entry not in entries:
        raise CompileError(f"kernel entry {entry!r} is not in the PTX (entries found: "
                           f"{entries or 'none'})")
    # Without these nvJitLink only says "bad input: does not match type NVJITLINK_INPUT_PTX".
    nvjitlink.ptx_isa(ptx)
    written_for = nvjitlink.ptx_target(ptx)
    archs, want_ptx = parse_target_list(targets)
    below = [a for a in archs if (a.major, a.minor) < (written_for.major, written_for.minor)]
    if below:  # ptxas would say only "SM version specified by .target is higher than default"
        names = sorted({t.strip().lower() for t in targets if t.strip().lower() != "ptx"
                        and parse_arch(t) in below})
        raise CompileError(f"the PTX is written for {written_for.sm} (.target), which targets "
                           f"{names} are below: nothing can be built or JIT-compiled for them")
    toolchain, cuda = nvjitlink.toolchain_id(), nvjitlink.cuda_version()
    named = {t.strip().lower() for t in targets}
    # "compute_80" without "sm_80" asks for PTX only
    cubin_archs = [a for a in archs if not (a.compute in named and a.sm not in named)]
    nvjitlink.check_archs(cubin_archs)
    images: list[Image] = []
    for arch, data in zip(cubin_archs,
                          nvjitlink.ptx_to_cubins(ptx, cubin_archs, name=f"{entry}.ptx")):
        _check_cubin(data, arch, entry)  # the text scan above cannot see every PTX construct
        images.append(Image("cubin", arch, data, toolchain=toolchain, cuda_version=cuda))
    if want_ptx:
        # The PTX was written elsewhere: its provenance is its ISA (.version), which is what the
        # driver's JIT must support; cuda_version 0 says "no toolkit produced this image".
        images.append(nvjitlink.ptx_image(ptx, toolchain=ptx_toolchain))
    if not images:
        raise ValueError(f"targets {list(targets)!r} ask for no image")
    return images


# ---- CUDA C ------------------------------------------------------------------------------------
def images_from_cuda(source: bytes, entry: str, targets: Sequence[str], options: tuple[str, ...],
                      program: str, headers: tuple[tuple[str, bytes], ...] = ()
                      ) -> tuple[list[Image], str]:
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
            ptx_archs.add(portable_lowest(archs))
        jobs += [(arch, True) for arch in sorted(ptx_archs)]
    expression = entry if nvrtc.needs_name_expression(entry) else None
    hint = ("" if expression is not None else
            "; a C++ kernel needs extern \"C\" or a name expression as entry ('k<float>')")
    toolchain, cuda_version = nvrtc.toolchain_id(), nvrtc.cuda_version()
    kernel: str | None = None
    images: list[Image] = []
    for arch, is_ptx in jobs:
        out = nvrtc.compile_program(source, arch, ptx=is_ptx, options=options,
                                    name_expression=expression, name=program,
                                    headers=headers)
        name = out.lowered_name or entry
        if not fits_name(name):  # the cubin reader would not list it: say why here
            raise CompileError(f"NVRTC lowered {entry!r:.80} to an entry name of "
                               f"{len(name.encode())} bytes, over the format's limit of "
                               f"{MAX_NAME_LENGTH} (shorter template arguments, or an "
                               f"extern \"C\" wrapper kernel)")
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
def images_from_cubins(cubin: bytes | Mapping[str, bytes], entry: str,
                        targets: Sequence[str]) -> list[Image]:
    if isinstance(cubin, Mapping):
        items = list(cubin.items())
        if not items:
            raise ValueError("cubin: the dict names no target")
    elif isinstance(cubin, (bytes, bytearray, memoryview)):
        if not all(isinstance(t, str) for t in targets):
            raise TypeError(f"targets must be strings such as 'sm_90' (got {list(targets)!r})")
        sms = sorted({t.strip().lower() for t in targets})
        if len(sms) != 1 or "ptx" in sms:
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
