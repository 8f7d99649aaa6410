"""Loading modules: choose the image for a device, compile PTX locally, ``cuLibraryLoadData``.

A library is loaded once per process per chosen image (``cuLibraryLoadData`` is
context-independent, so devices of the same architecture share it; devices that choose
different images get different libraries), on first use, under a lock. Only the chosen image's
bytes are read from the artifact. PTX is never handed to the driver's JIT on every start: it is
compiled with nvJitLink for the device and the cubin kept in the cache directory
(``<cache>/runtime-ptx/``), written atomically. Only when nvJitLink is missing (or newer in
major than the driver) does the driver JIT it, with a warning.

Selections are cached by what decides them (each image's kind, arch, toolkit and PTX ISA, and
the device), never by module object: a cache holding the modules' images would keep every
pack ever loaded in memory (an image reads from its artifact's buffer), and one keyed by
``id()`` would grow with every pack a long-running process loads and drops.

Error guarantee: a failed load leaves nothing loaded — a library whose kernels cannot all be
found is unloaded before the error propagates, and nothing is recorded in the registry.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..errors import KernelPackError
from .device import Device
from . import driver as _drv
from .selection import Selection, image_label, select_image

__all__ = ["LoadedLibrary", "load_module", "preload", "image_bytes", "ptx_cache_path",
           "loaded_libraries"]


class LoadedLibrary:
    """A loaded ``CUlibrary`` and its kernels (``CUkernel`` by entry name). ``source``:
    "cubin", "ptx->cubin (cached)", "ptx->cubin (nvJitLink)" or "ptx (driver JIT)";
    ``loaded_on``: device ordinals where the functions were loaded. A plain class, not a
    dataclass: building one costs a few hundred microseconds inside a process's first launch."""

    __slots__ = ("key", "handle", "kernels", "image", "source", "loaded_on")

    def __init__(self, key: tuple, handle: Any, kernels: dict[str, Any], image: str,
                 source: str, loaded_on: set[int] | None = None) -> None:
        self.key = key
        self.handle = handle
        self.kernels = kernels
        self.image = image
        self.source = source
        self.loaded_on: set[int] = set() if loaded_on is None else loaded_on

    def __repr__(self) -> str:
        return (f"LoadedLibrary(key={self.key!r}, handle={self.handle!r}, "
                f"kernels={self.kernels!r}, image={self.image!r}, source={self.source!r}, "
                f"loaded_on={self.loaded_on!r})")


_libraries: dict[tuple, LoadedLibrary] = {}
# selection key (see _selection_key) -> (index of the chosen image, reason per image)
_selections: dict[tuple, tuple[int, list[str]]] = {}
_lock = threading.RLock()


def _after_fork_in_child() -> None:
    """A forked child starts with nothing loaded: the parent's ``CUlibrary`` handles are not
    valid in it, and its lock may be held by a parent thread that does not exist here."""
    global _lock, _libraries, _selections
    _lock = threading.RLock()
    _libraries = {}
    _selections = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def loaded_libraries() -> list[LoadedLibrary]:
    """The libraries this process has loaded (for tests and diagnostics)."""
    with _lock:
        return list(_libraries.values())


def image_bytes(image: Any) -> bytes:
    """The raw bytes of an image: the loader's ``read()`` (digest-checked, decompressed) or a
    :class:`kernelpack.Image`'s ``data``."""
    read = getattr(image, "read", None)
    data = read() if callable(read) else getattr(image, "data", None)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"image {image_label(image)} has no bytes (got {type(data).__name__})")
    return bytes(data)


def _image_key(image: Any) -> tuple:
    digest = getattr(image, "digest", None)
    if isinstance(digest, (bytes, bytearray)):
        digest = bytes(digest).hex()
    if not digest:
        import hashlib

        digest = hashlib.sha256(image_bytes(image)).hexdigest()
    return (image.kind, image_label(image), str(digest))


def ptx_cache_path(ptx: bytes, arch_sm: str, toolchain: str) -> Any:
    """Where the cubin compiled from ``ptx`` for ``arch_sm`` by ``toolchain`` is kept (a
    ``Path``; see :mod:`._ptx_load`, imported only on this rare path)."""
    from ._ptx_load import ptx_cache_path as _path

    return _path(ptx, arch_sm, toolchain)


def _load_library(code: bytes, kernels: tuple[str, ...], what: str) -> tuple[Any, dict[str, Any]]:
    """``cuLibraryLoadData`` then ``cuLibraryGetKernel`` for every entry; all or nothing."""
    drv = _drv.bindings()
    handle = _drv.check(drv.cuLibraryLoadData(code, None, None, 0, None, None, 0),
                        f"cuLibraryLoadData of {what}")
    try:
        found: dict[str, Any] = {}
        for name in kernels:
            found[name] = _drv.check(drv.cuLibraryGetKernel(handle, name.encode()),
                                     f"cuLibraryGetKernel({name!r}) in {what}")
        return handle, found
    except BaseException:
        drv.cuLibraryUnload(handle)  # best effort: the original error is what matters
        raise


def load_module(module: Any, device: Device) -> tuple[Selection, LoadedLibrary]:
    """Select the image of ``module`` for ``device`` and load it (once per process).

    ``module`` has ``name``, ``kernels`` and ``images`` (the loader's ``ModuleInfo`` or a
    :class:`kernelpack.Module`). Returns the selection and the loaded library.

    Raises
    ------
    CompatibilityError
        No image fits the device/driver (the message lists every image with its reason), or the
        driver refuses the chosen one.
    CompileError
        nvJitLink failed on the PTX image (its log attached).
    LaunchError
        Another driver failure (named, chained to the CUresult).
    """
    images = tuple(module.images)
    sel_key = _selection_key(images, device)
    with _lock:
        what = f"module {module.name!r}"
        hit = _selections.get(sel_key)
        if hit is not None:  # the same choice, made again with this module's own images
            index, reasons = hit
            selection = Selection(images[index], device.arch, device.driver_version,
                                  list(zip(images, reasons)))
        else:
            # the ordinal too: on a box of mixed GPUs "this device" alone does not say which
            selection = select_image(images, device.arch, device.driver_version,
                                     f"{what} (device {device.ordinal})")
            chosen = selection.chosen
            _selections[sel_key] = (next(i for i, img in enumerate(images) if img is chosen),
                                    [reason for _, reason in selection.reasons])
        image = selection.chosen
        key = _image_key(image)
        if image.kind == "ptx":
            key = (*key, device.arch.sm)
        lib = _libraries.get(key)
        if lib is None:
            lib = _load_chosen(module, image, key, device, what)
            _libraries[key] = lib
        missing = [k for k in module.kernels if k not in lib.kernels]
        if missing:  # same image bytes reached through a module declaring more kernels
            drv = _drv.bindings()
            for name in missing:
                lib.kernels[name] = _drv.check(drv.cuLibraryGetKernel(lib.handle, name.encode()),
                                               f"cuLibraryGetKernel({name!r}) in {what}")
        return selection, lib


def _selection_key(images: tuple, device: Device) -> tuple:
    """Everything :func:`select_image` reads: per image its kind, arch, toolkit version and
    PTX ISA, and the device (whose arch and driver are fixed for the process). No image
    object: the key must not keep a pack's buffer alive."""
    return (device.ordinal, tuple(
        (img.kind, img.arch, int(getattr(img, "cuda_version", 0) or 0),
         _isa(getattr(img, "ptx_isa", None))) for img in images))


def _isa(isa: Any) -> tuple | None:
    return None if isa is None else tuple(isa)


def _load_chosen(module: Any, image: Any, key: tuple, device: Device, what: str) -> LoadedLibrary:
    label = f"{what} ({image_label(image)} for device {device.ordinal}, {device.arch.sm})"
    data = image_bytes(image)
    with device.pushed():  # the caller's current device is left as it was
        return _load_code(module, image, key, device, data, label)


def _load_code(module: Any, image: Any, key: tuple, device: Device, data: bytes,
               label: str) -> LoadedLibrary:
    if image.kind == "cubin":
        handle, kernels = _load_library(data, tuple(module.kernels), label)
        return LoadedLibrary(key, handle, kernels, image_label(image), "cubin")
    from ._ptx_load import _ptx_code  # the PTX path only: keeps nvJitLink/pathlib lazy

    code, source, path = _ptx_code(data, device)
    try:
        handle, kernels = _load_library(code, tuple(module.kernels), label)
    except KernelPackError:
        if source != "ptx->cubin (cached)" or path is None:
            raise
        # A cached cubin the driver refuses (truncated by a crash elsewhere, older format):
        # evict it and compile again, once.
        try:
            path.unlink()
        except OSError:
            pass
        code, source, path = _ptx_code(data, device)
        handle, kernels = _load_library(code, tuple(module.kernels), label)
    return LoadedLibrary(key, handle, kernels, image_label(image), source)


def preload(lib: LoadedLibrary, device: Device) -> None:
    """Force the library's kernels into ``device``'s context now (``cuKernelGetFunction`` +
    ``cuFuncLoad``), so the first launch pays nothing: what ``warmup`` is for."""
    if device.ordinal in lib.loaded_on:
        return
    drv = _drv.bindings()
    with device.pushed():  # warmup must not switch the caller's current device
        for name, kernel in list(lib.kernels.items()):
            func = _drv.check(drv.cuKernelGetFunction(kernel),
                              f"cuKernelGetFunction({name!r}) on device {device.ordinal}")
            load = getattr(drv, "cuFuncLoad", None)
            if load is not None:
                _drv.check(load(func), f"cuFuncLoad({name!r}) on device {device.ordinal}")
    lib.loaded_on.add(device.ordinal)

