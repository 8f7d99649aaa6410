"""LLVM through llvmlite: IR text → verified, libdevice-linked, optimized module → PTX.

This is the only place the lowering touches ``llvmlite.binding`` (native code); building IR
(:mod:`kernelpack.lowering.codegen`) is pure Python. Target machines are made once per
(arch, PTX ISA) and reused. LLVM's own NVPTX defaults are kept except the PTX ISA, which is
pinned to 8.0 (``+ptx80``, CUDA 12.0) so the ``ptx`` image JITs on any driver from 12.0 on —
or to the first ISA that knows the architecture, where that is newer (sm_100: 8.6, sm_120:
8.7, sm_103/sm_121/family ``f`` targets: 8.8, sm_88/sm_110: 9.0). LLVM does not raise for an
ISA too old for its target: it aborts the process, so this choice is made here.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache

from ..errors import CompileError

__all__ = ["TRIPLE", "PTX_FEATURES", "ptx_features", "llvm_version", "target_machine", "pass_builder",
           "data_layout", "emit_ptx"]

TRIPLE = "nvptx64-nvidia-cuda"
PTX_FEATURES = "+ptx80"
_CPU_RE = re.compile(r"sm_(\d+?)(\d)([af]?)$")


def ptx_features(cpu: str) -> str:
    """The PTX ISA feature for ``cpu`` (``sm_90a``): ``+ptx80`` unless the architecture needs a
    newer ISA (PTX ISA notes: sm_100/101 8.6, sm_120 8.7, sm_103/121 and ``f`` targets 8.8,
    sm_88/110 9.0)."""
    match = _CPU_RE.match(cpu)
    if not match:
        return PTX_FEATURES
    cc, suffix = int(match.group(1)) * 10 + int(match.group(2)), match.group(3)
    need = 80
    if cc >= 100:
        need = 86
    if cc >= 120:
        need = 87
    if cc in (103, 121) or suffix == "f":
        need = 88
    if cc == 88 or 110 <= cc < 120:
        need = 90
    return f"+ptx{need}"
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
        tm = target.create_target_machine(cpu=cpu, features=ptx_features(cpu), opt=opt)
    except RuntimeError as exc:
        raise CompileError(f"LLVM has no NVPTX target for {cpu}: {exc}") from exc
    tm.set_asm_verbosity(False)
    return tm


def data_layout() -> str:
    return str(target_machine("sm_80").target_data)


def pass_builder(cpu: str, opt: int = 3):
    """A new-pass-manager builder bound to the NVPTX machine (so NVVMReflect and the NVPTX
    passes are registered), at LLVM optimization level ``opt`` (0..3)."""
    llvm = _binding()
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    return llvm.create_pass_builder(target_machine(cpu, opt), pto)


def emit_ptx(ir_text: str, cpu: str, kernels: tuple[str, ...], libdevice: bool,
             opt: int = 3) -> bytes:
    """Parse, verify, link libdevice (when the IR calls ``__nv_*``), internalize everything but
    ``kernels``, run LLVM's ``opt`` pipeline (``kp.compile(..., opt=)``, 0..3) and emit PTX for
    ``cpu`` from a target machine at the same level.

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
        pb = pass_builder(cpu, opt)
        try:
            pb.getModulePassManager().run(mod, pb)
            ptx = target_machine(cpu, opt).emit_assembly(mod)
        except RuntimeError as exc:
            raise CompileError(f"LLVM failed to emit PTX for {cpu}", str(exc)) from exc
    if ".extern .func" in ptx:  # an unresolved call: nvJitLink would fail later, less clearly
        raise CompileError(f"PTX for {cpu} calls a function nothing defines", ptx)
    return ptx.encode()
