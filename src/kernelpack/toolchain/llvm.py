"""LLVM through llvmlite: IR text → verified, libdevice-linked, optimized module → PTX.

This is the only place the lowering touches ``llvmlite.binding`` (native code); building IR
(:mod:`kernelpack.lowering.codegen`) is pure Python. Target machines are made once per
(arch, PTX ISA) and reused. LLVM's own NVPTX defaults are kept except the PTX ISA, which is
pinned to 8.0 (``+ptx80``, CUDA 12.0) so the ``ptx`` image JITs on any driver from 12.0 on.
"""

from __future__ import annotations

import threading
from functools import lru_cache

from ..errors import CompileError

__all__ = ["TRIPLE", "PTX_FEATURES", "llvm_version", "target_machine", "pass_builder",
           "data_layout", "emit_ptx"]

TRIPLE = "nvptx64-nvidia-cuda"
PTX_FEATURES = "+ptx80"
_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _binding():
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


def llvm_version() -> str:
    """``"LLVM 22.1.0 (llvmlite 0.50.0)"``: toolchain provenance for images and cache keys."""
    import llvmlite

    major, minor, patch = _binding().llvm_version_info
    return f"LLVM {major}.{minor}.{patch} (llvmlite {llvmlite.__version__})"


@lru_cache(maxsize=None)
def target_machine(cpu: str, opt: int = 3):
    """The NVPTX target machine for ``cpu`` (``sm_80``)."""
    llvm = _binding()
    try:
        target = llvm.Target.from_triple(TRIPLE)
        tm = target.create_target_machine(cpu=cpu, features=PTX_FEATURES, opt=opt)
    except RuntimeError as exc:
        raise CompileError(f"LLVM has no NVPTX target for {cpu}: {exc}") from exc
    tm.set_asm_verbosity(False)
    return tm


def data_layout() -> str:
    return str(target_machine("sm_80").target_data)


def pass_builder(cpu: str, opt: int = 3):
    """A new-pass-manager builder bound to the NVPTX machine (so NVVMReflect and the NVPTX
    passes are registered)."""
    llvm = _binding()
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    return llvm.create_pass_builder(target_machine(cpu), pto)


def emit_ptx(ir_text: str, cpu: str, kernels: tuple[str, ...], libdevice: bool) -> bytes:
    """Parse, verify, link libdevice (when the IR calls ``__nv_*``), internalize everything but
    ``kernels``, run LLVM's O3 pipeline and emit PTX for ``cpu``.

    Raises CompileError with LLVM's message on malformed IR or a backend failure.
    """
    llvm = _binding()
    with _LOCK:  # llvmlite contexts are global; keep one compile at a time inside LLVM
        try:
            mod = llvm.parse_assembly(ir_text)
            mod.verify()
        except RuntimeError as exc:
            raise CompileError("LLVM rejected the generated IR", f"{exc}\n{ir_text}") from exc
        if libdevice:
            from .libdevice import subset_module

            lib = subset_module()
            lib.data_layout = mod.data_layout
            lib.triple = mod.triple
            try:
                mod.link_in(lib)
            except RuntimeError as exc:
                raise CompileError("linking libdevice failed", str(exc)) from exc
        keep = set(kernels)
        for fn in mod.functions:
            if not fn.is_declaration and fn.name not in keep:
                fn.linkage = "internal"
        pb = pass_builder(cpu)
        try:
            pb.getModulePassManager().run(mod, pb)
            ptx = target_machine(cpu).emit_assembly(mod)
        except RuntimeError as exc:
            raise CompileError(f"LLVM failed to emit PTX for {cpu}", str(exc)) from exc
    if ".extern .func" in ptx:  # an unresolved call: nvJitLink would fail later, less clearly
        raise CompileError(f"PTX for {cpu} calls a function nothing defines", ptx)
    return ptx.encode()
