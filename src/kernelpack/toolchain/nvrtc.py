"""CUDA C/C++ → cubin or PTX through NVRTC, which, like nvJitLink, needs no GPU and no driver.

Used by ``kp.external(cuda=...)``. NVRTC is called directly for every target: a cubin per
``sm_XY`` (NVRTC runs ptxas itself, so a cubin is exactly what ``nvcc -cubin`` would give) and
PTX for a ``compute_XY``. The bindings come from ``cuda.bindings.nvrtc``; the shared library
(``libnvrtc.so.N``) is found by cuda-pathfinder on the first call, which is where a missing
library shows up — so every entry point here turns that failure into a :class:`CompileError`
that says what to install. Nothing here is imported by ``import kernelpack`` or on the load path.

Determinism: NVRTC's output depends only on the source, the options and the NVRTC build, with
one exception kernelpack removes: by default NVRTC also searches the *current directory* for
``#include "..."`` files (it treats the program name as a path relative to it). Every
compilation here passes ``--no-source-include``, so headers come only from ``-I`` options the
caller gives, and the same call gives the same bytes wherever it runs. Line info
(``-lineinfo``) would record the current directory too (NVRTC makes the program name absolute
with it): with those options the name passed is absolute already. One thing remains:
``-G`` cubins carry the directory as DWARF's compilation directory (ptxas writes it).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping

from ..errors import CompileError
from ..targets import Arch

__all__ = ["version", "toolchain_id", "key_identity", "cuda_version", "supported_archs",
           "check_options", "check_headers",
           "needs_name_expression", "compile_program", "NvrtcOutput", "INSTALL_HINT",
           "DEFAULT_OPTIONS"]

INSTALL_HINT = "pip install nvidia-cuda-nvrtc (or kernelpack[compile])"

#: Passed before the caller's options on every compilation (see the module docstring).
DEFAULT_OPTIONS: tuple[str, ...] = ("--no-source-include",)

# Options that choose the architecture or the kind of output. kernelpack sets the architecture
# per target and always wants a whole-program cubin or PTX; any of these would make the image
# disagree with what the artifact records (or not be loadable code at all). Long and short
# spellings, without the "=value" part.
_FORBIDDEN: dict[str, str] = {
    "--gpu-architecture": "the architecture comes from targets=",
    "-arch": "the architecture comes from targets=",
    "--relocatable-device-code": "images must be whole-program code, not relocatable objects",
    "-rdc": "images must be whole-program code, not relocatable objects",
    "--device-c": "images must be whole-program code, not relocatable objects",
    "-dc": "images must be whole-program code, not relocatable objects",
    "--compile-only": "images must be whole-program code, not relocatable objects",
    "--extensible-whole-program": "images must be whole-program code",
    "-ewp": "images must be whole-program code",
    "--dlink-time-opt": "LTO-IR is not an image kind kernelpack stores",
    "-dlto": "LTO-IR is not an image kind kernelpack stores",
    "--gen-opt-lto": "LTO-IR is not an image kind kernelpack stores",
    "--emit-llvm-bc": "LLVM bitcode is not an image kind kernelpack stores",
    "--optix-ir": "OptiX IR is not an image kind kernelpack stores",
    "--emit-optix-ir": "OptiX IR is not an image kind kernelpack stores",
    "-optix-ir": "OptiX IR is not an image kind kernelpack stores",
    "--enable-tile": "CUDA tile IR is not an image kind kernelpack stores",
    "--tile-only": "CUDA tile IR is not an image kind kernelpack stores",
    "--tile-as-default-execution-space": "CUDA tile IR is not an image kind kernelpack stores",
    "--device-syntax-only": "it produces no code",
    "--fdevice-syntax-only": "it produces no code",
    "-fdevice-syntax-only": "it produces no code",
}
_FLAG_RE = re.compile(r"[=\s]")
# Options that write the program's file name into the code (line tables, debug info).
_LINE_INFO = frozenset({"-lineinfo", "--generate-line-info", "-G", "--device-debug"})


@dataclass(frozen=True)
class NvrtcOutput:
    """One NVRTC compilation: the code (cubin or PTX, no trailing NUL), the lowered (mangled)
    name of the name expression if one was given, and NVRTC's log (warnings; may be empty)."""

    data: bytes
    lowered_name: str | None
    log: str


# Output buffers are bytearrays: the legacy bindings write through the buffer protocol, and
# writing into an immutable ``bytes`` (as NVIDIA's samples do with b" " * size) would corrupt
# CPython's shared one-byte objects when the size is 1 (an empty log is just its NUL).


def _bindings() -> Any:
    """``cuda.bindings.nvrtc``; imported here so that only ``cuda=`` users pay for it."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - cuda-bindings is a required dependency
        raise CompileError(f"cuda= needs NVRTC, whose Python bindings could not be imported "
                           f"({exc}): {INSTALL_HINT}") from exc
    return nvrtc


def _check(result: tuple, what: str) -> tuple:
    """Unpack a ``(nvrtcResult, *values)`` tuple of the legacy bindings; raise on failure."""
    err, *values = result
    if int(err) != 0:
        raise CompileError(f"NVRTC: {what} failed: {_error_name(err)}")
    return tuple(values)


def _error_name(err: Any) -> str:
    name = getattr(err, "name", None)
    return str(name) if name else f"nvrtcResult {int(err)}"


@lru_cache(maxsize=1)
def version() -> tuple[int, int]:
    """NVRTC's (major, minor). The first call loads ``libnvrtc``; a missing library is a
    CompileError telling the user what to install."""
    nvrtc = _bindings()
    try:
        major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    except CompileError:
        raise
    except Exception as exc:  # cuda-pathfinder's DynamicLibNotFoundError is a RuntimeError
        raise CompileError(f"NVRTC (libnvrtc) could not be loaded: {exc}. "
                           f"Install it: {INSTALL_HINT}") from exc
    return int(major), int(minor)


def cuda_version() -> int:
    """The toolkit version of NVRTC as 1000*major + 10*minor (13050 for 13.5), recorded on
    every image it makes so the runtime can drop images newer than the driver."""
    major, minor = version()
    return 1000 * major + 10 * minor


def toolchain_id() -> str:
    """``"NVRTC 13.5"``: the provenance string images record (``Image.toolchain``)."""
    major, minor = version()
    return f"NVRTC {major}.{minor}"


@lru_cache(maxsize=1)
def key_identity() -> str:
    """``"NVRTC 13.5; nvidia-cuda-nvrtc 13.5.37"``: what a cache key of a ``cuda=`` external
    must include, since NVRTC's output changes with its build, not only its major.minor (the
    wheel's version when NVRTC comes from one; the API version alone otherwise)."""
    from importlib import metadata

    for dist in ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13", "nvidia-cuda-nvrtc-cu12"):
        try:
            return f"{toolchain_id()}; {dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return toolchain_id()


@lru_cache(maxsize=1)
def supported_archs() -> tuple[int, ...]:
    """The SM numbers this NVRTC compiles for (75, 80, 86, ...), to name an unsupported
    target up front rather than through NVRTC's terse "invalid option" result."""
    version()  # the library-not-found error, with its install hint, comes from here
    (archs,) = _check(_bindings().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


def check_options(options: Iterable[str]) -> tuple[str, ...]:
    """Validate the caller's NVRTC options; returns them as a tuple.

    Raises TypeError for a non-string option (or a bare string instead of a list, which would
    otherwise be split into characters) and ValueError naming a flag that would set the
    architecture or the output kind, which kernelpack controls per target.
    """
    if isinstance(options, (str, bytes)):
        raise TypeError(f"nvrtc_options must be a list of flags such as ['-DBLOCK=256'] "
                        f"(got the string {options!r})")
    try:  # None or a number would otherwise fail as "'NoneType' object is not iterable"
        items = list(options)
    except TypeError:
        raise TypeError(f"nvrtc_options must be a list of flags such as ['-DBLOCK=256'] "
                        f"(got {options!r:.80})") from None
    out: list[str] = []
    for i, opt in enumerate(items):
        if not isinstance(opt, str) or not opt.strip():
            raise TypeError(f"nvrtc_options[{i}] must be a non-empty string (got {opt!r})")
        if "\0" in opt:
            raise ValueError(f"nvrtc_options[{i}] contains a NUL character")
        flag = _FLAG_RE.split(opt.strip(), maxsplit=1)[0]
        why = _FORBIDDEN.get(flag)
        if why is not None:
            raise ValueError(f"nvrtc_options: {flag!r} is not allowed ({opt!r}): {why}; "
                             f"kernelpack compiles a cubin per sm_XY target and PTX for "
                             f"compute_XY itself")
        out.append(opt)
    return tuple(out)


def check_headers(headers: Any) -> tuple[tuple[str, bytes], ...]:
    """Validate ``headers=`` (``{"name.h": text}``, ``#include "name.h"`` files given as text
    rather than through ``-I``); returns ``(name, bytes)`` pairs sorted by name, so the
    program NVRTC sees does not depend on the dict's order. Raises TypeError for a non-dict,
    a non-string name or non-text contents, ValueError for an empty name or a NUL (NVRTC
    takes C strings: the text would end there)."""
    if headers is None:
        return ()
    if not isinstance(headers, Mapping):
        raise TypeError(f"headers must be a dict of include name -> text (got {headers!r:.80})")
    out: list[tuple[str, bytes]] = []
    for name, text in headers.items():
        if not isinstance(name, str):
            raise TypeError(f"headers: names must be strings such as 'defs.h' (got {name!r})")
        if not name.strip() or "\0" in name:
            raise ValueError(f"headers: {name!r} is not a usable include name")
        if isinstance(text, str):
            text = text.encode()
        elif isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text)
        else:
            raise TypeError(f"headers[{name!r}] must be text (str/bytes), got "
                            f"{type(text).__name__}")
        if b"\0" in text.rstrip(b"\0"):
            raise ValueError(f"headers[{name!r}] contains a NUL byte")
        out.append((name, text.rstrip(b"\0")))
    return tuple(sorted(out))


def needs_name_expression(entry: str) -> bool:
    """True when ``entry`` is a C++ name expression (``scale<float>``, ``ns::k``,
    ``(void(*)(float*))k``) to be lowered by NVRTC, rather than a symbol name as it appears
    in the code (an ``extern "C"`` name, or an already mangled one)."""
    return any(mark in entry for mark in ("(", "<", "::"))


# NVRTC compiles on the calling thread's stack and needs more than 64 KiB of it (a thread made
# after threading.stack_size(64 * 1024) died with SIGSEGV in nvrtcCompileProgram: review 34).
# A thread other than the main one (whose stack is the process's, RLIMIT_STACK) may have any
# size, unknown from Python, so its compiles run on a thread of this size.
COMPILE_STACK_BYTES = 16 << 20
_STACK_SIZE_LOCK = threading.Lock()


def _on_a_large_stack(fn: Callable[[], NvrtcOutput]) -> NvrtcOutput:
    """``fn()`` on a stack of :data:`COMPILE_STACK_BYTES`: the main thread's own, else a new
    thread's (the caller waits; its exception is re-raised here). The new thread owns the
    whole NVRTC program (created, compiled, destroyed): a caller that stops waiting (an
    exception raised into it meanwhile) cannot destroy a program still compiling."""
    if threading.current_thread() is threading.main_thread():
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    with _STACK_SIZE_LOCK:  # (process-wide: another thread started meanwhile gets it too)
        previous = threading.stack_size(COMPILE_STACK_BYTES)
        try:
            worker = threading.Thread(target=run, name="kernelpack-nvrtc", daemon=True)
            worker.start()
        finally:
            threading.stack_size(previous)
    worker.join()
    if "error" in box:
        error = box.pop("error")
        try:
            raise error
        finally:
            del error  # (no cycle through this frame)
    return box["value"]  # type: ignore[no-any-return]


def compile_program(source: bytes, arch: Arch, *, ptx: bool, options: tuple[str, ...] = (),
                    name_expression: str | None = None, name: str = "kernel.cu",
                    headers: tuple[tuple[str, bytes], ...] = ()) -> NvrtcOutput:
    """Compile CUDA C++ ``source`` for one target (on a stack large enough for NVRTC,
    whatever the calling thread's: :func:`_on_a_large_stack`).

    Parameters
    ----------
    source:
        The translation unit (UTF-8 bytes, no NUL).
    arch:
        The target: a cubin for ``arch.sm`` or, with ``ptx=True``, PTX for ``arch.compute``.
    options:
        The caller's checked options (:func:`check_options`), after :data:`DEFAULT_OPTIONS`.
    name_expression:
        A C++ name expression whose mangled name to return (templates, overloads).
    name:
        The program name, shown in NVRTC's messages (and in line info); not a path.
    headers:
        ``(include name, text)`` pairs (:func:`check_headers`) that ``#include "name"``
        finds without any ``-I``.

    Raises
    ------
    CompileError
        NVRTC is missing, does not support ``arch``, or rejected the source or options; the
        message names the target and NVRTC's log is attached.
    """
    return _on_a_large_stack(lambda: _compile_program(source, arch, ptx, options,
                                                      name_expression, name, headers))


def _compile_program(source: bytes, arch: Arch, ptx: bool, options: tuple[str, ...],
                     name_expression: str | None, name: str,
                     headers: tuple[tuple[str, bytes], ...]) -> NvrtcOutput:
    nvrtc = _bindings()
    target = arch.compute if ptx else arch.sm
    if arch.major * 10 + arch.minor not in supported_archs():
        known = ", ".join(f"sm_{a}" for a in supported_archs())
        raise CompileError(f"{toolchain_id()} cannot compile for {target} (it supports {known})")
    opts = [f"--gpu-architecture={target}", *DEFAULT_OPTIONS, *options]
    if any(_FLAG_RE.split(o.strip(), maxsplit=1)[0] in _LINE_INFO for o in options):
        # line info names the file as the current directory + a relative program name
        # (".file 1 \"/home/me/k.cu\""): an absolute name keeps the bytes the same everywhere
        name = "/" + name.lstrip("/")
    (prog,) = _check(nvrtc.nvrtcCreateProgram(source, name.encode(), len(headers),
                                              [text for _, text in headers],
                                              [h.encode() for h, _ in headers]),
                     "nvrtcCreateProgram")
    try:
        if name_expression is not None:
            _check(nvrtc.nvrtcAddNameExpression(prog, name_expression.encode()),
                   f"adding the name expression {name_expression!r}")
        encoded = [o.encode() for o in opts]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log = _log(nvrtc, prog)
        if int(result) != 0:
            raise CompileError(f"NVRTC failed to compile {name} for {target} "
                               f"({_error_name(result)}; options {opts})", log)
        lowered = None
        if name_expression is not None:
            try:
                (raw,) = _check(nvrtc.nvrtcGetLoweredName(prog, name_expression.encode()),
                                f"lowering the name expression {name_expression!r}")
            except CompileError as exc:
                raise CompileError(f"{exc} for {target}: it must name a __global__ function "
                                   f"(for a template, with its arguments: 'k<float>')",
                                   log) from exc
            lowered = raw.decode() if isinstance(raw, bytes) else str(raw)
        if ptx:
            (size,) = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            buf = bytearray(size)
            _check(nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
        else:
            (size,) = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            buf = bytearray(size)
            _check(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        data = bytes(buf).rstrip(b"\0") if ptx else bytes(buf)
        return NvrtcOutput(data=data, lowered_name=lowered, log=log)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _log(nvrtc: Any, prog: Any) -> str:
    """NVRTC's program log (errors and warnings), best effort."""
    try:
        (size,) = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = bytearray(size)
        _check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        return bytes(buf).rstrip(b"\0").decode(errors="replace").strip()
    except Exception:  # the log is best effort; the error itself is being raised
        return ""
