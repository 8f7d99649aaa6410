"""The PTX path of :mod:`.library`: compile PTX with nvJitLink for the device through the
on-disk cache (``<cache>/runtime-ptx/``), or hand it to the driver's JIT with a warning when
nvJitLink is missing. A separate module so that loading a cubin (the common case) does not
import or compile this code.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .._warn import warn_caller
from ..errors import CompileError
from .device import Device

__all__ = ["ptx_cache_path"]


def ptx_cache_path(ptx: bytes, arch_sm: str, toolchain: str) -> Path | None:
    """Where the cubin compiled from ``ptx`` for ``arch_sm`` by ``toolchain`` is kept; None
    when there is no cache directory (no home directory and no ``KERNELPACK_CACHE_DIR``, as
    for an arbitrary container uid): the PTX is then compiled on every first load, never a
    failed launch. Absolute, as the disk tier's root is (a relative ``KERNELPACK_CACHE_DIR``
    is the working directory's; none when that was removed)."""
    from ..config import default_cache_dir
    from ..filewrite import absolute

    try:
        root = Path(absolute(os.path.expanduser(os.fspath(default_cache_dir()))))
    except (ValueError, OSError):
        return None
    from ..toolchain.ptxas_guard import GUARD_ID

    # the guard's id: cubins assembled before a ptxas workaround are not reused
    key = hashlib.sha256(b"kernelpack-ptx-cubin-v1\0" + GUARD_ID.encode() + b"\0"
                         + toolchain.encode() + b"\0"
                         + arch_sm.encode() + b"\0" + ptx).hexdigest()
    return root / "runtime-ptx" / key[:2] / f"{key[2:]}.cubin"


def _usable(path: Path) -> bool:
    """Whether the cubin at ``path`` may be read and written as this user's own: the cache's
    directories on the way are directories of their own (a planted link is never followed)
    and none is writable by every user (anyone could have planted the cubin the driver would
    then load). Warns when not; the PTX is then assembled on every first load."""
    from ..cache.disk import DiskStore

    root = path.parents[2]  # <root>/runtime-ptx/<shard>/<name>.cubin
    try:
        why = DiskStore(root).untrusted(path.parent, "runtime-ptx")
    except (ValueError, OSError) as exc:  # the root is no directory, or cannot be looked at
        why = str(exc)
    if why is None:
        return True
    warn_caller(f"the cubins kernelpack assembles from PTX are not kept in, nor read from, "
                f"{str(path.parent)!r}: {why}; it is assembled again at each process's first "
                f"load", RuntimeWarning)
    return False


def _read_cached(path: Path) -> bytes:
    """The cubin kept at ``path``, or b"" (none, or not a regular file: a FIFO planted under
    its name must not block the first launch, nor a device be read whole)."""
    from .._smallfile import read_regular
    from ..limits import MAX_IMAGE_SIZE

    try:
        data = read_regular(path, MAX_IMAGE_SIZE)
    except OSError:
        return b""
    return data if data is not None and len(data) <= MAX_IMAGE_SIZE else b""


def _write_atomic(path: Path, data: bytes) -> None:
    """Temp file (a fresh name, made exclusively: a link planted under it is not followed) +
    fsync + ``os.replace``: readers see the whole cubin or none. Best effort: a cache that
    cannot be written costs a recompile next time, never a failed launch."""
    from ..cache._files import write_atomic
    from ..errors import CacheError

    try:
        write_atomic(path, data)
    except (OSError, CacheError):
        return


def _driver_jit(ptx: bytes, device: Device) -> tuple[bytes, str, None]:
    """The PTX for the driver to JIT, with a warning where the driver's ptxas is one that
    miscompiles this module (:mod:`kernelpack.toolchain.ptxas_guard`: the driver's JIT
    takes no per-module workaround here)."""
    from ..toolchain.ptxas_guard import FIXED_IN, needs_guard

    driver = (device.driver_version // 1000, device.driver_version % 1000 // 10)
    if driver < FIXED_IN and needs_guard(ptx):
        warn_caller(f"the driver (CUDA {driver[0]}.{driver[1]}) JITs PTX that holds signed "
                    f"integer min/max of negated values, which CUDA releases before "
                    f"{FIXED_IN[0]}.{FIXED_IN[1]} can miscompile (wrong results); install "
                    f"nvidia-nvjitlink of the driver's major so kernelpack assembles it with "
                    f"the workaround", RuntimeWarning)
    return ptx.rstrip(b"\0") + b"\0", "ptx (driver JIT)", None


def _ptx_code(ptx: bytes, device: Device) -> tuple[bytes, str, Path | None]:
    """Compile PTX for ``device`` with nvJitLink through the cache; returns (code, source, the
    cache path to evict if the driver rejects it)."""
    from ..targets import Arch

    arch = Arch(device.arch.major, device.arch.minor)
    try:
        from ..toolchain import nvjitlink
        jit_version = nvjitlink.version()
    except (ImportError, CompileError) as exc:
        warn_caller(f"nvJitLink is unavailable ({exc}); the driver will JIT the PTX for "
                    f"{arch.sm} (slow at every start). Install nvidia-nvjitlink to compile "
                    f"once and cache the cubin.", RuntimeWarning)
        return _driver_jit(ptx, device)
    if jit_version[0] > device.driver_version // 1000:
        warn_caller(f"nvJitLink {jit_version[0]}.{jit_version[1]} is a newer major than the "
                    f"driver (CUDA {device.driver_version // 1000}); the driver will JIT the "
                    f"PTX for {arch.sm} instead", RuntimeWarning)
        return _driver_jit(ptx, device)
    path = ptx_cache_path(ptx, arch.sm, nvjitlink.toolchain_id())
    if path is not None and not _usable(path):
        path = None
    cached = _read_cached(path) if path is not None else b""
    if cached[:4] == b"\x7fELF":
        return cached, "ptx->cubin (cached)", path
    cubin = nvjitlink.ptx_to_cubin(ptx, arch, name="kernelpack-runtime.ptx")
    if path is not None:
        _write_atomic(path, cubin)
    return cubin, "ptx->cubin (nvJitLink)", path
