"""libdevice: NVIDIA's math library as LLVM bitcode, found, parsed once, trimmed per compile.

libdevice is ~470 KB of bitcode with ~570 functions; parsing it costs ~45 ms and cloning it as
much again. So the first compile that needs math parses it once and keeps a *subset* module
holding only the functions kernelpack's codegen can call (plus what they call, and their
constant tables). Every later compile clones that small module, links it, and lets
internalize + global DCE strip whatever the kernel does not use, so the PTX stays small.
``__nvvm_reflect`` calls are folded by LLVM's NVVMReflect pass, which the NVPTX target adds to
the optimization pipeline; the ``nvvm-reflect-ftz`` module flag (0) selects IEEE denormals.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from functools import lru_cache
from pathlib import Path

from .. import config
from ..errors import CompileError

__all__ = ["find", "digest", "subset_module", "FUNCTIONS"]

# Everything kernelpack.lowering may call (f32 spelling and f64 spelling).
_BASE = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
         "pow", "floor", "ceil", "fabs", "hypot", "fmod", "sincos", "sincospi")
FUNCTIONS: tuple[str, ...] = tuple(sorted({f"__nv_{b}f" for b in _BASE} |
                                          {f"__nv_{b}" for b in _BASE}))

_LOCK = threading.Lock()
_SUBSET: bytes | None = None


def _candidates() -> list[Path]:
    out: list[Path] = []
    override = config.libdevice_override()
    if override is not None:
        return [override]
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        for rel in ("cu13/nvvm/libdevice", "cu12/nvvm/libdevice", "cuda_nvcc/nvvm/libdevice",
                    "nvvm/libdevice"):
            out.append(Path(root) / rel / "libdevice.10.bc")
    home = config.cuda_home()
    for base in ([home] if home else []) + [Path("/usr/local/cuda")]:
        out.append(base / "nvvm" / "libdevice" / "libdevice.10.bc")
    return out


@lru_cache(maxsize=1)
def find() -> Path:
    """The libdevice bitcode file; CompileError listing the places searched."""
    candidates = _candidates()
    for path in candidates:
        if path.is_file():
            return path
    override = config.libdevice_override()
    if override is not None and override.exists():  # there, but a FIFO, device or directory
        raise CompileError(f"KERNELPACK_LIBDEVICE={str(override)!r} is not a regular file (it "
                           f"must name the libdevice.10.bc bitcode file)")
    raise CompileError("libdevice.10.bc not found; install nvidia-nvvm (pip install "
                       "kernelpack[compile]) or set KERNELPACK_LIBDEVICE. Searched: "
                       + ", ".join(str(p) for p in candidates))


@lru_cache(maxsize=1)
def digest() -> str:
    """``sha256:<hex>`` of the libdevice file (toolchain provenance and cache keys)."""
    return "sha256:" + hashlib.sha256(find().read_bytes()).hexdigest()


def subset_module():  # -> llvmlite.binding.ModuleRef
    """A fresh module holding the libdevice functions of :data:`FUNCTIONS` (external linkage)
    and their dependencies; callers link it into theirs (which consumes it)."""
    import llvmlite.binding as llvm

    global _SUBSET
    with _LOCK:
        if _SUBSET is None:
            _SUBSET = _build_subset(llvm)
    return llvm.parse_bitcode(_SUBSET)


def _build_subset(llvm) -> bytes:
    from .llvm import pass_builder

    try:
        mod = llvm.parse_bitcode(find().read_bytes())
    except Exception as exc:
        raise CompileError(f"cannot parse libdevice at {find()}: {exc}") from exc
    keep = set(FUNCTIONS)
    for fn in mod.functions:
        if not fn.is_declaration and fn.name not in keep:
            fn.linkage = "internal"
    pb = pass_builder("sm_80", opt=0)
    mpm = llvm.create_new_module_pass_manager()
    mpm.add_global_dead_code_eliminate_pass()
    mpm.run(mod, pb)
    mod.triple = "nvptx64-nvidia-cuda"
    return mod.as_bitcode()
