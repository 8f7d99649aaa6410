"""PTX → cubin through nvJitLink, which needs no GPU and no driver.

nvJitLink produces the SASS toolkit-side, so a cubin made with a newer toolkit of the same
major runs under an older driver (minor-version compatibility); that is why kernelpack never
relies on the driver's PTX JIT at load time.
"""

from __future__ import annotations

import contextlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, Iterator, Sequence

from ..errors import CompileError
from ..compiled import Image
from ..targets import Arch

__all__ = ["version", "toolchain_id", "cuda_version", "check_archs", "ptx_to_cubin",
           "ptx_to_cubins", "ptx_image", "ptx_isa", "ptx_target", "resource_usage"]

_VERSION_RE = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)
_TARGET_RE = re.compile(rb"^\s*\.target\s+(sm_\d+[af]?)", re.MULTILINE)


def _module():
    try:
        from cuda.bindings import nvjitlink
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise CompileError("nvJitLink is not available: install kernelpack[compile] "
                           "(nvidia-nvjitlink and cuda-bindings)") from exc
    return nvjitlink


@lru_cache(maxsize=1)
def version() -> tuple[int, int]:
    """nvJitLink's (major, minor)."""
    try:
        major, minor = _module().version()
    except Exception as exc:  # the shared library itself may be missing
        raise CompileError(f"nvJitLink could not be loaded: {exc} (pip install "
                           f"nvidia-nvjitlink, or kernelpack[compile])") from exc
    return int(major), int(minor)


def cuda_version() -> int:
    """The toolkit version of the linker as 1000*major + 10*minor (13050 for 13.5)."""
    major, minor = version()
    return 1000 * major + 10 * minor


def toolchain_id() -> str:
    major, minor = version()
    return f"nvJitLink {major}.{minor}"


def ptx_isa(ptx: bytes) -> tuple[int, int]:
    """The ``.version`` of a PTX text; CompileError if it has none."""
    match = _VERSION_RE.search(ptx)
    if not match:
        raise CompileError("PTX has no .version directive")
    return int(match.group(1)), int(match.group(2))


def ptx_target(ptx: bytes) -> Arch:
    """The architecture a PTX text was written for (its ``.target``)."""
    from ..targets import parse_arch

    match = _TARGET_RE.search(ptx)
    if not match:
        raise CompileError("PTX has no .target sm_XY directive")
    return parse_arch(match.group(1).decode())


def check_archs(archs: Sequence[Arch]) -> None:
    """Refuse, naming ``targets``, an architecture this nvJitLink cannot build for (one newer
    than the toolchain, ``sm_999``) before anything is compiled: otherwise LLVM printed "not a
    recognized processor" lines to the process's stderr and the error came last, as nvJitLink
    rejecting its own options."""
    unknown = ", ".join(repr(arch.sm) for arch in archs if not _knows(arch.sm))
    if unknown:
        raise CompileError(f"targets: {toolchain_id()} cannot build for {unknown} (a GPU newer "
                           f"than this toolchain needs a newer nvidia-nvjitlink; or a typo)")


@lru_cache(maxsize=None)
def _knows(sm: str) -> bool:
    """Whether nvJitLink accepts ``-arch=sm``: it checks the option when a handle is created,
    which costs microseconds and builds nothing."""
    nvjitlink = _module()
    version()  # a missing library is its own error, not "unknown architecture"
    try:
        handle = nvjitlink.create(1, [f"-arch={sm}"])
    except Exception:
        return False
    nvjitlink.destroy(handle)
    return True


def ptx_to_cubin(ptx: bytes | str, arch: Arch, *, name: str = "kernel.ptx",
                 options: tuple[str, ...] = ("-O3",)) -> bytes:
    """Assemble PTX into a cubin for ``arch``; raises CompileError carrying nvJitLink's log.

    Modules that an affected ptxas miscompiles get its workaround option added
    (:mod:`.ptxas_guard`)."""
    with _assembled(ptx, arch, name, options) as (nvjitlink, handle):
        size = nvjitlink.get_linked_cubin_size(handle)
        cubin = bytearray(size)
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)


@contextlib.contextmanager
def _assembled(ptx: bytes | str, arch: Arch, name: str,
               options: tuple[str, ...]) -> Iterator[tuple[Any, int]]:
    """``(nvjitlink, handle)`` of ``ptx`` assembled for ``arch`` with ``options`` and the
    ptxas guard's (:func:`ptx_to_cubin`, :func:`resource_usage`); the handle is destroyed on
    leaving. CompileError (with nvJitLink's log) where it refuses the options or the PTX."""
    from .ptxas_guard import guard_options

    nvjitlink = _module()
    data = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    if not data.endswith(b"\0"):
        data += b"\0"  # nvJitLink reads PTX as a C string
    opts = [f"-arch={arch.sm}", *options, *guard_options(data, version())]
    try:
        handle = nvjitlink.create(len(opts), opts)
    except Exception as exc:
        raise CompileError(f"nvJitLink rejected the options {opts}: {exc}") from exc
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), name)
            nvjitlink.complete(handle)
        except Exception as exc:
            raise CompileError(f"nvJitLink failed to build {name} for {arch.sm}: {exc}",
                               _log(nvjitlink, handle)) from exc
        yield nvjitlink, handle
    finally:
        nvjitlink.destroy(handle)


def ptx_to_cubins(ptx: bytes | str, archs: Sequence[Arch], *, name: str = "kernel.ptx"
                  ) -> list[bytes]:
    """One cubin per architecture, in ``archs``' order, assembled on up to one thread per CPU.

    Assembling is most of a row fusion's compile (ptxas takes ~0.45 s per architecture for a
    softmax's thirteen kernels), nvJitLink releases the GIL, and its handles are independent
    (its API is thread-safe for distinct handles), so the architectures run side by side.
    The cubins are the same bytes as one at a time; a failure raises the error of the first
    failing architecture in ``archs``' order, after every thread has finished (none is left
    running behind the exception)."""
    archs = list(archs)
    workers = min(len(archs), _cpus())
    if workers > 1:
        try:
            with ThreadPoolExecutor(max_workers=workers,
                                    thread_name_prefix="kernelpack-ptxas") as pool:
                futures = [pool.submit(ptx_to_cubin, ptx, arch, name=name) for arch in archs]
                # leaving the block waits for every thread: no assembly outlives a failure
        except RuntimeError as exc:  # no thread to be had: at interpreter exit, or a limit
            if not _no_thread(exc):
                raise
        else:
            return [f.result() for f in futures]
    return [ptx_to_cubin(ptx, arch, name=name) for arch in archs]



_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_SPILL_RE = re.compile(r"(\d+) bytes spill stores")
_REGS_RE = re.compile(r"Used (\d+) registers")


def resource_usage(ptx: bytes | str, arch: Arch) -> dict[str, tuple[int, int]]:
    """``{entry: (registers, spill store bytes)}`` of every kernel in ``ptx`` assembled for
    ``arch``, from ptxas's verbose report through nvJitLink (``-Xptxas=-v``; no GPU needed).

    A row kernel's registers decide how many rows an SM holds, so the schedule's choices are
    checked against it (tests/lowering/test_regrows.py, benchmarks/row_configs.py). Raises
    CompileError where nvJitLink refuses the module. Assembled as :func:`ptx_to_cubin`
    assembles (the ptxas guard's options included), so the figures are the cubin's."""
    with _assembled(ptx, arch, "kernel.ptx", ("-O3", "-Xptxas=-v")) as (nvjitlink, handle):
        log = bytearray(nvjitlink.get_info_log_size(handle))
        if log:
            nvjitlink.get_info_log(handle, log)
    out: dict[str, tuple[int, int]] = {}
    entry, spill = None, 0
    for line in bytes(log).rstrip(b"\0").decode(errors="replace").splitlines():
        if m := _ENTRY_RE.search(line):
            entry, spill = m.group(1), 0
        elif m := _SPILL_RE.search(line):
            spill = int(m.group(1))
        elif (m := _REGS_RE.search(line)) and entry is not None:
            out[entry] = (int(m.group(1)), spill)
            entry = None  # a function's report (not an entry's) has no "Compiling entry"
    return out


def _no_thread(exc: RuntimeError) -> bool:
    """Whether ``exc`` is the thread pool's "no new thread" (``submit`` during interpreter
    shutdown, or ``can't start new thread`` under a process or memory limit), which the
    caller answers by assembling in its own thread."""
    text = str(exc)
    return "interpreter shutdown" in text or "new thread" in text


def _cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _log(nvjitlink, handle: int) -> str:
    try:
        size = nvjitlink.get_error_log_size(handle)
        buf = bytearray(size)
        if size:
            nvjitlink.get_error_log(handle, buf)
        return bytes(buf).rstrip(b"\0").decode(errors="replace")
    except Exception:  # the log is best effort; the error itself is already being raised
        return ""


def ptx_image(ptx: bytes | str, toolchain: str = "") -> Image:
    """Wrap PTX text as a ``ptx`` image, recording its ISA and target."""
    data = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    data = data.rstrip(b"\0")
    return Image("ptx", ptx_target(data), data, toolchain=toolchain, ptx_isa=ptx_isa(data))
