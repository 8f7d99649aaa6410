"""The one place kernelpack reads environment variables.

Every variable kernelpack looks at is *declared* here as a :class:`Knob`: its name, default,
documentation, and whether it can change generated code. Knobs that can (``codegen=True``) are
folded into every cache key by :func:`codegen_env`, so flipping one can never produce a stale
cache hit (Triton's lesson: its C++ allowlist of "cache-invalidating" variables). A test scans
``src/kernelpack`` and fails when code reads a variable through anything but :func:`get`, or
reads one that is not declared.

Other modules add their knobs with :func:`declare` at import time of *this* module (append to
the list at the bottom), so the registry is complete before anything reads it.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Iterator

from ._records import FrozenRecord

if TYPE_CHECKING:  # imported where a path is made: pathlib is ~3 ms of ``import kernelpack``
    from pathlib import Path

__all__ = [
    "Knob", "declare", "knob", "knobs", "get", "codegen_env",
    "cache_dir", "default_cache_dir", "cache_max_bytes", "remote_cache_url", "explain_cache_misses",
    "libdevice_override", "cuda_home", "native_launch", "per_thread_default_stream",
    "driver_api", "torch_exchange_api", "switch", "parse_size",
]


class Knob(FrozenRecord):
    """A declared environment variable.

    ``codegen`` is True when its value can change the bytes of a compiled artifact; such knobs
    are part of every cache key. Paths that select a toolchain file (``KERNELPACK_LIBDEVICE``)
    are *not* codegen knobs: the key holds the file's digest instead, since an absolute path in
    a key would make identical machines miss.

    A record rather than a dataclass: this module is imported by the runtime's first launch,
    where building a dataclass would cost about a millisecond.
    """

    __slots__ = ("name", "default", "codegen", "doc")
    name: str
    default: str | None
    codegen: bool
    doc: str

    def __init__(self, name: str, default: str | None, codegen: bool, doc: str) -> None:
        self._set(name=name, default=default, codegen=codegen, doc=doc)


_REGISTRY: dict[str, Knob] = {}


def declare(name: str, default: str | None = None, *, codegen: bool, doc: str) -> Knob:
    """Register a knob; declaring the same name twice with different facts is a ValueError."""
    if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
        raise ValueError(f"knob name must be an environment variable name (got {name!r})")
    new = Knob(name, default, bool(codegen), doc)
    old = _REGISTRY.get(name)
    if old is not None and old != new:
        raise ValueError(f"knob {name!r} is already declared differently ({old} vs {new})")
    _REGISTRY[name] = new
    return new


def knob(name: str) -> Knob:
    """The declaration of ``name``; KeyError naming the known knobs when it is undeclared."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"environment variable {name!r} is not declared in kernelpack.config "
                       f"(declared: {sorted(_REGISTRY)})") from None


def knobs() -> Iterator[Knob]:
    """All declared knobs, sorted by name."""
    for name in sorted(_REGISTRY):
        yield _REGISTRY[name]


def get(name: str) -> str | None:
    """The value of declared knob ``name``: the environment's if set and non-empty, else its
    default. Reading an undeclared name raises KeyError, which is the point."""
    decl = knob(name)
    value = os.environ.get(name)
    return value if value else decl.default


def codegen_env() -> tuple[tuple[str, str], ...]:
    """``(name, value)`` of every codegen knob, sorted, for cache keys. An unset knob is
    recorded as ``"<unset>"`` so that setting it to its default still changes nothing only when
    the value is literally the same."""
    return tuple((k.name, get(k.name) or "<unset>") for k in knobs() if k.codegen)


# ---- accessors ---------------------------------------------------------------------------------
def cache_dir() -> Path:
    """The disk cache root: ``$KERNELPACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/kernelpack``, else
    ``~/.cache/kernelpack`` (never /tmp, which is often tmpfs and lost on reboot)."""
    from pathlib import Path

    explicit = get("KERNELPACK_CACHE_DIR")
    if explicit:
        if explicit != explicit.strip():  # e.g. "$(cat file)" with its newline: a directory
            # named "kernelpack\n", or " /x" relative to wherever the process runs
            raise ValueError(f"KERNELPACK_CACHE_DIR has leading or trailing whitespace "
                             f"(got {explicit!r}); remove it")
        return Path(explicit).expanduser()
    xdg = get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says relative values are to be ignored
        return Path(xdg) / "kernelpack"
    return Path.home() / ".cache" / "kernelpack"


def default_cache_dir() -> Path:
    """:func:`cache_dir` for a cache about to be opened there: ValueError naming
    ``KERNELPACK_CACHE_DIR`` when no absolute default exists (no ``$HOME`` and no passwd entry,
    as for an arbitrary container uid, where ``Path.home()`` raises RuntimeError or, on newer
    Pythons, is a literal ``~``), instead of a bare RuntimeError or a cache that silently
    appears under ``./~/.cache`` in whatever the working directory is."""
    from pathlib import Path

    try:
        root = cache_dir()
        problem = f"it resolves to {str(root)!r}"
    except RuntimeError as exc:  # Path.home() on Python 3.11: "Could not determine home..."
        root, problem = Path("~"), str(exc)
    if not get("KERNELPACK_CACHE_DIR") and not os.path.isabs(os.path.expanduser(root)):
        raise ValueError(f"no default cache directory: the home directory is unknown ($HOME "
                         f"unset or relative, no passwd entry: {problem}); "
                         f"set KERNELPACK_CACHE_DIR or XDG_CACHE_HOME to an absolute path, or "
                         f"pass kp.Cache(path=...)")
    return root


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str, max_digits: int | None = None) -> int | None:
    """``4096``, ``512M``, ``4G``, ``12 MiB`` (K/M/G/T: powers of 1024, any case) in bytes, or
    None when ``text`` is no such size (or has more than ``max_digits`` digits): the one
    spelling of a size for the variables and the command line."""
    digits = r"\d+" if max_digits is None else rf"\d{{1,{max_digits}}}"
    match = re.fullmatch(rf"({digits})\s*([kmgt]?)i?b?", text.strip().lower())
    return None if match is None else int(match.group(1)) * _SIZE_UNITS[match.group(2)]


_MAX_SIZE_DIGITS = 4000  # short of Python's int-from-text limit (4300 digits)


def cache_max_bytes() -> int | None:
    """The disk cache size cap in bytes (``$KERNELPACK_CACHE_MAX_BYTES``: ``4096``, ``512M``,
    ``10G``, powers of 1024 as ``kernelpack cache prune --max-bytes`` takes them; ``0`` or
    ``none`` means unbounded). ValueError naming the variable when it is not such a size."""
    value = (get("KERNELPACK_CACHE_MAX_BYTES") or "").strip().lower()
    if value in ("", "0", "none"):
        return None
    if value.startswith("-") and value[1:].isdigit():
        raise ValueError(f"KERNELPACK_CACHE_MAX_BYTES must be >= 0 (got {value:.40})")
    digits = len(value) - len(value.lstrip("0123456789"))
    if digits > _MAX_SIZE_DIGITS:
        raise ValueError(f"KERNELPACK_CACHE_MAX_BYTES is too large (a number of {digits} "
                         f"digits)")
    size = parse_size(value, max_digits=_MAX_SIZE_DIGITS)
    if size is None:
        raise ValueError(f"KERNELPACK_CACHE_MAX_BYTES must be a byte count such as 4096, 512M "
                         f"or 10G (got {value!r:.60})")
    return size or None


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def switch(name: str, default: bool) -> bool:
    """An on/off variable: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``
    (any case, spaces ignored), unset or empty for ``default``. Anything else is a ValueError
    naming the variable: an operator who set a switch to turn something off must learn that
    it was not understood, not find it still on."""
    value = (get(name) or "").strip().lower()
    if not value:
        return default
    if value in _ON or value in _OFF:
        return value in _ON
    raise ValueError(f"{name} must be 1/true/yes/on or 0/false/no/off (got {value!r})")


def remote_cache_url() -> str | None:
    """``$KERNELPACK_REMOTE_CACHE`` (e.g. ``redis://host:6379/0``), used when ``kp.Cache`` is
    given no ``remote=``."""
    return get("KERNELPACK_REMOTE_CACHE")


def explain_cache_misses() -> bool:
    """``$KERNELPACK_CACHE_EXPLAIN=1``: log why every cache miss missed (the nearest recorded
    key and the parts that differ), without changing code."""
    return switch("KERNELPACK_CACHE_EXPLAIN", False)


def libdevice_override() -> Path | None:
    """An explicit libdevice bitcode file (``$KERNELPACK_LIBDEVICE``)."""
    from pathlib import Path

    value = get("KERNELPACK_LIBDEVICE")
    return Path(value).expanduser() if value else None


def cuda_home() -> Path | None:
    """A CUDA toolkit root from ``$CUDA_HOME`` or ``$CUDA_PATH`` (in that order)."""
    from pathlib import Path

    value = get("CUDA_HOME") or get("CUDA_PATH")
    return Path(value).expanduser() if value else None


def native_launch() -> bool:
    """Whether launches may go through kernelpack's C extension (``$KERNELPACK_NATIVE_LAUNCH``,
    default on; ``0``/``false``/``no``/``off`` launch through the Python driver door instead:
    ctypes over ``libcuda.so.1``, or cuda.bindings with ``KERNELPACK_DRIVER=cuda-bindings``;
    the same semantics at about twice the host cost). The verifier's C walk, in the same
    extension, is not affected."""
    return switch("KERNELPACK_NATIVE_LAUNCH", True)


def per_thread_default_stream() -> bool:
    """Whether stream handle 0 means the per-thread default stream: cuda.bindings' own switch
    (``$CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM``, any non-empty value), read so that
    kernelpack's C launch path asks the driver for the same ``cuLaunchKernel`` flavour."""
    return bool(get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"))


DRIVER_APIS = ("auto", "cuda-bindings")


def driver_api() -> str:
    """How the runtime reaches the CUDA driver (``$KERNELPACK_DRIVER``): ``auto`` (default:
    ctypes over libcuda on Linux, no cuda.bindings import) or ``cuda-bindings``. Anything else
    is a ValueError naming the variable."""
    value = (get("KERNELPACK_DRIVER") or "auto").strip().lower()
    if value not in DRIVER_APIS:
        raise ValueError(f"KERNELPACK_DRIVER must be one of {', '.join(DRIVER_APIS)} "
                         f"(got {value!r})")
    return value


def torch_exchange_api() -> bool:
    """Whether the C fast path reads torch tensors through DLPack's C exchange API
    (``torch.Tensor.__dlpack_c_exchange_api__``, PyTorch 2.10+) where torch has it
    (``$KERNELPACK_TORCH_EXCHANGE_API``, default on; ``0``/``false``/``no``/``off`` read the
    tensors' attributes instead, as with older torch)."""
    return switch("KERNELPACK_TORCH_EXCHANGE_API", True)


# ---- the registry ------------------------------------------------------------------------------
declare("KERNELPACK_CACHE_DIR", None, codegen=False,
        doc="Disk cache root; overrides $XDG_CACHE_HOME/kernelpack.")
declare("KERNELPACK_CACHE_MAX_BYTES", str(10 << 30), codegen=False,
        doc="Disk cache size cap in bytes (LRU eviction); 0 or 'none' for no cap.")
declare("XDG_CACHE_HOME", None, codegen=False,
        doc="Base of per-user caches (XDG); the disk cache lives in its 'kernelpack' folder.")
declare("KERNELPACK_REMOTE_CACHE", None, codegen=False,
        doc="Remote cache URL (redis://host:port/db) used when kp.Cache gets no remote=.")
declare("KERNELPACK_CACHE_EXPLAIN", None, codegen=False,
        doc="1: log, for every cache miss, the key parts that differ from the nearest entry.")
declare("KERNELPACK_LIBDEVICE", None, codegen=False,
        doc="Path of libdevice.10.bc; cache keys hold the file's digest, not the path.")
declare("CUDA_HOME", None, codegen=False,
        doc="CUDA toolkit root, searched for libdevice when no wheel provides it.")
declare("CUDA_PATH", None, codegen=False,
        doc="Alternative spelling of CUDA_HOME (Windows convention).")
declare("KERNELPACK_NATIVE_LAUNCH", None, codegen=False,
        doc="0: launch through the Python driver door instead of kernelpack's C extension.")
declare("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", None, codegen=False,
        doc="cuda.bindings' per-thread default stream switch; kernelpack's launches follow it.")
declare("KERNELPACK_DRIVER", "auto", codegen=False,
        doc="cuda-bindings: reach the driver through cuda.bindings instead of ctypes (auto).")
declare("KERNELPACK_TORCH_EXCHANGE_API", None, codegen=False,
        doc="0: the C fast path reads torch tensors' attributes, not DLPack's C exchange API.")
